#!/usr/bin/env bash
# Pack this interpreter's standard-library sources (the corpus the shipped tokenizer was trained
# on) into .corpus/stdlib.tar.gz, to carry to the GPU machine: its image runs another Python
# whose stdlib is smaller (no `test` package), which would change the corpus. On the GPU:
#   mkdir -p /tmp/stdlib && tar xzf .corpus/stdlib.tar.gz -C /tmp/stdlib
#   kdtree train all ... --corpus-root /tmp/stdlib
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
root=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
mkdir -p .corpus
(cd "$root" && find . -name '*.py' -not -path './site-packages/*' -not -path './pydoc_data/*' \
    -not -path '*/__pycache__/*' -print0 | sort -z | tar --null -T - -czf "$OLDPWD/.corpus/stdlib.tar.gz")
echo "packed $root -> .corpus/stdlib.tar.gz ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
