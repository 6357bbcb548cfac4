# Source at the start of every device call: wheels into /tmp/site, CUPTI into the torch env.
export PYTHONUNBUFFERED=1 RES=/tmp/res NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/site
for d in .whl-base .whl-fi .whl-nb; do
  [ -d "$d" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $d/*.whl
done
if [ -d .whl-cupti ]; then
  python3 -c "import cuda.bindings" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl-cb/*.whl
  python3 -m pip install -q --no-index --no-deps .whl-cupti/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
# nbconvert/jupyter data files (HTML templates, kernelspecs) of the --target install
export JUPYTER_PATH=/tmp/site/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}
