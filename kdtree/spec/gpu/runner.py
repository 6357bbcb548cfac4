"""``GraphStepRunner``: the whole decode step on the device, replayed from a CUDA graph.

One step = draft → top-K → device tree build → verify inputs (in place) → target verify →
sample/walk → one-launch KV commit → drafter context update → state update, with no host sync.
All state the step reads or writes lives in static device buffers (``bonus``, ``prefix``, the
verify buffers, a ring of emitted tokens), so the captured graph replays the next step as is.
The host only wakes every ``sync_every`` steps: it copies the ring out (streaming tokens),
applies stop tokens / ``max_new_tokens``, records committed lengths in the cache and reserves
pages ahead for the next window.

The engine's three modes run through the same body (same tokens as ``SpecEngine.step``):

* ``tree``: the DDTree of ``engine.budget`` nodes from the drafter's top-``engine.top_k``;
* ``chain``: the drafter's argmax block ``[bonus, d_1 .. d_D]``, ``D = block_size - 1`` — the
  DDTree at ``top_k = 1``, ``budget = D`` — as a static path tree (only the tokens change per
  step; no tree build, and no KV commit since an accepted path prefix is already in place);
* ``ar``: no drafter; the root (bonus) alone is verified (``T = 1``), one token per step.

On the device, a request whose ``max_new_tokens`` is reached stops committing at once (so a
window never runs past the pages reserved for it); stop tokens are applied at the host sync.

``mode="eager"`` runs the same step body without a graph (any device, CPU tests);
``mode="graph"`` captures once per (batch, budget) after ``warmup`` eager steps and replays;
``mode="auto"`` picks graph on CUDA. Finished requests keep their row but commit nothing.
"""

from __future__ import annotations

import torch

from kdtree.attention import AttnMetadata
from kdtree.profiler import phase
from kdtree.profiler import step as profiler_step
from kdtree.spec.bitmask import chain_mask, num_words, pack_bits
from kdtree.spec.gpu.commit import CommitPlan, commit_path, make_commit_plan
from kdtree.spec.gpu.tree_build import DeviceTree, build_trees_device
from kdtree.spec.gpu.verify_inputs import DeviceVerifyBuffers, reserve_ahead
from kdtree.spec.gpu.walk import sample_tokens_device, walk_trees_device
from kdtree.spec.records import StepRecord
from kdtree.spec.tree import draft_topk

__all__ = ["MODES", "GraphStepRunner"]

#: Engine modes the runner drives.
MODES = ("ar", "chain", "tree")

_NO_LIMIT = 2**62  # device ``left`` of a request without ``max_new_tokens``


class GraphStepRunner:
    """Drive ``engine`` (a ``SpecEngine`` in mode ``ar``, ``chain`` or ``tree``) over ``state``
    with device-only steps.

    ``budget`` (nodes verified besides the root) follows the mode: ``engine.budget`` (``tree``),
    ``block_size - 1`` (``chain``), ``0`` (``ar``). ``max_batch`` / ``max_budget``: the largest
    shapes this runner may capture (default: the state's batch and that budget); asking for
    more raises instead of replaying a wrong graph. ``sync_every``: steps between host syncs
    (token streaming); a window is cut shorter only when the cache could not hold its worst
    case (a request without ``max_new_tokens`` near the end of its page table).
    """

    def __init__(
        self,
        engine,
        state,
        *,
        mode: str = "auto",
        sync_every: int = 1,
        warmup: int = 2,
        tree_backend: str = "auto",
        commit_backend: str = "auto",
        fill_backend: str = "auto",
        max_batch: int | None = None,
        max_budget: int | None = None,
        seed: int = 0,
    ) -> None:
        if mode not in ("auto", "eager", "graph"):
            raise ValueError(f"mode={mode!r}: expected 'auto', 'eager' or 'graph'")
        if engine.mode not in MODES:
            raise ValueError(f"engine.mode={engine.mode!r}: the runner drives one of {MODES}")
        if engine.mode != "ar" and engine.drafter is None:
            raise ValueError(f"engine.drafter: required for engine.mode={engine.mode!r}")
        if engine.dense_mask:
            raise ValueError("engine.dense_mask=True: the generic path stays on the engine")
        if sync_every < 1 or warmup < 1:
            raise ValueError(f"sync_every={sync_every}, warmup={warmup}: expected both >= 1")
        self.engine, self.state = engine, state
        self.device = engine.device
        if mode == "auto":
            mode = "graph" if self.device.type == "cuda" else "eager"
        if mode == "graph" and self.device.type != "cuda":
            raise RuntimeError(f"mode='graph' needs a CUDA device; the engine is on {self.device}")
        self.mode = mode
        self.kind = engine.mode  # ar | chain | tree
        if self.kind == "tree":
            budget = engine.budget
        elif self.kind == "chain":
            budget = engine.block_size - 1  # the DDTree at top_k = 1: the argmax chain
        else:
            budget = 0  # ar: the root alone
        self.max_batch = max_batch if max_batch is not None else state.batch
        self.max_budget = max_budget if max_budget is not None else budget
        self.check_shape(state.batch, budget)
        self.sync_every, self.warmup = sync_every, warmup
        self.tree_backend, self.commit_backend = tree_backend, commit_backend
        self.fill_backend = fill_backend
        cache = state.cache
        B, dev = state.batch, self.device
        self.B, self.budget, self.T = B, budget, budget + 1
        self.D = engine.block_size - 1  # ar: block_size 1, no draft depths
        self.P = min(self.D, self.budget) + 1
        self.reqs = list(state.reqs)
        self._contiguous = self.reqs == list(range(B))
        self._reqs_dev = torch.tensor(self.reqs, dtype=torch.int64).to(dev)
        # static state buffers
        self.bonus = torch.tensor(state.bonus, dtype=torch.int64).to(dev)
        self.prefix = torch.tensor(state.context_lens, dtype=torch.int32).to(dev)
        self.active = torch.tensor([not d for d in state.done], dtype=torch.bool).to(dev)
        # tokens each request may still emit (max_new_tokens); the device stops committing at 0
        self.left = torch.tensor(self._left_host(), dtype=torch.int64).to(dev)
        self.vbuf = DeviceVerifyBuffers(B, self.budget, dev)
        S = sync_every
        self.step_dev = torch.zeros((), dtype=torch.int64, device=dev)
        self.hist_tokens = torch.full((S, B, self.P), -1, dtype=torch.int64, device=dev)
        self.hist_count = torch.zeros(S, B, dtype=torch.int64, device=dev)
        self.hist_nodes = torch.zeros(S, B, dtype=torch.int64, device=dev)
        self.hist_prefix = torch.zeros(S, B, dtype=torch.int32, device=dev)
        self.uniforms = torch.zeros(S, B, self.T, dtype=torch.float32, device=dev)
        self._ugen = torch.Generator().manual_seed(seed)
        self._arange_p = torch.arange(self.P, dtype=torch.int64, device=dev)
        if self.kind != "tree":  # ar / chain: one static path tree, only its tokens change
            T, idx = self.T, torch.arange(self.T, dtype=torch.int64, device=dev)
            self._path = DeviceTree(
                tokens=torch.zeros(B, T, dtype=torch.int64, device=dev),
                parents=(idx - 1).expand(B, T).contiguous(),
                depths=idx.expand(B, T).contiguous(),
                mask=pack_bits(chain_mask(T)).to(dev).expand(B, T, num_words(T)).contiguous(),
                scores=torch.zeros(B, T, dtype=torch.float32, device=dev),
                ranks=torch.zeros(B, T, dtype=torch.int64, device=dev),
                n_nodes=torch.full((B,), T, dtype=torch.int64, device=dev),
            )
        self.plan: CommitPlan | list[torch.Tensor]
        use_triton = commit_backend == "triton" or (
            commit_backend == "auto" and dev.type == "cuda"
        )
        self.plan = (
            make_commit_plan(cache)
            if use_triton
            else (list(cache.k) + list(cache.v) if cache.kind == "gqa" else list(cache.kv))
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self._steps_done = 0  # steps executed since the last host sync
        self._window = sync_every  # steps of the current window (set by _prepare_window)
        self._total_steps = 0
        self.records: list[StepRecord] = []
        self._prepare_window()

    # ------------------------------------------------------------------ checks

    def check_shape(self, batch: int, budget: int) -> None:
        """Raise unless (batch, budget) fits what this runner captures."""
        if batch > self.max_batch:
            raise ValueError(f"batch={batch}: above the captured batch bucket {self.max_batch}")
        if budget > self.max_budget:
            raise ValueError(f"budget={budget}: above the captured budget {self.max_budget}")

    def _left_host(self) -> list[int]:
        """Tokens each request may still emit (``_NO_LIMIT`` without ``max_new_tokens``)."""
        st = self.state
        if st.max_new_tokens is None:
            return [_NO_LIMIT] * st.batch
        return [max(0, st.max_new_tokens - len(t)) for t in st.tokens]

    def _path_tree(self, tokens: torch.Tensor) -> DeviceTree:
        """The static path tree (``ar``, ``chain``) carrying ``tokens [B, T]``."""
        p = self._path
        return DeviceTree(tokens, p.parents, p.depths, p.mask, p.scores, p.ranks, p.n_nodes)

    def _page_table(self) -> torch.Tensor:
        pt = self.state.cache.page_table
        return pt[: self.B] if self._contiguous else pt.index_select(0, self._reqs_dev)

    # ------------------------------------------------------------------ the step body

    def _step_body(self) -> None:
        """One decode step on the device: reads and writes only static buffers."""
        eng, st = self.engine, self.state
        cache = st.cache
        L32 = self.prefix
        L = L32.to(torch.int64)
        root = self.bonus.unsqueeze(1)
        if self.kind == "ar":  # no draft: verify the root alone
            tree = self._path_tree(root)
        else:
            with phase("draft"):
                logits = eng.drafter.draft(st.draft_ctx, self.bonus, L)
            if logits.dim() != 3 or tuple(logits.shape[:2]) != (self.B, self.D):
                raise ValueError(
                    f"drafter.draft: expected logits [{self.B}, {self.D}, V], got "
                    f"{tuple(logits.shape)}"
                )
            with phase("tree_build"):
                if self.kind == "chain":  # = SpecEngine._argmax: the chain's proposals
                    tree = self._path_tree(torch.cat([root, logits.argmax(dim=-1)], dim=1))
                else:
                    lp, tok = draft_topk(logits, eng.top_k)
                    tree = build_trees_device(
                        lp, tok, self.budget, self.bonus, backend=self.tree_backend
                    )
        with phase("prepare_for_verify"):
            pt = self._page_table()
            self.vbuf.fill(tree, L32, pt, cache.page_size, backend=self.fill_backend)
            attn = AttnMetadata(
                mode="tree",
                slot_mapping=self.vbuf.slot_mapping,
                page_table=pt,
                prefix_lens=L32,
                tree_mask=self.vbuf.tree_mask,
                backend=eng.backend,
            )
        with phase("verify"):
            out = eng.target(
                self.vbuf.input_ids,
                self.vbuf.positions,
                cache,
                attn,
                return_taps=eng.drafter is not None,
            )
        with phase("accept"):
            ring = torch.remainder(self.step_dev, self.sync_every).reshape(1)
            u = self.uniforms.index_select(0, ring)[0] if eng.temperature > 0 else None
            post = sample_tokens_device(out.logits, eng.temperature, uniforms=u)
            acc = walk_trees_device(tree, post, self.P)
            count = torch.where(self.active, acc.count, 0)
        with phase("commit"):
            if self.kind == "tree":  # a path tree's accepted rows already sit at L + depth
                commit_path(
                    self.plan,
                    pt,
                    L32,
                    acc.path,
                    count,
                    cache.page_size,
                    backend=self.commit_backend,
                )
            path = acc.path.clamp(min=0)
            node_tok = self.vbuf.input_ids.gather(1, path)
            if eng.drafter is not None:
                # drafter context: accepted nodes' taps at positions L .. L + count - 1
                feats = out.taps.gather(1, path.unsqueeze(-1).expand(-1, -1, out.taps.shape[-1]))
                pos = L.unsqueeze(1) + self._arange_p
                eng.drafter.append_context(st.draft_ctx, feats, pos, count)
                if getattr(eng.drafter, "needs_tokens", False):
                    eng.drafter.append_tokens(st.draft_ctx, node_tok, count)
        # emitted tokens: the accepted nodes after the root, then the bonus
        k = self._arange_p.unsqueeze(0)
        shifted = torch.cat([node_tok[:, 1:], node_tok[:, :1]], dim=1)
        emit = torch.where(k == (count - 1).unsqueeze(1), acc.bonus.unsqueeze(1), shifted)
        emit = torch.where(k < count.unsqueeze(1), emit, -1)
        self.hist_tokens.index_copy_(0, ring, emit.unsqueeze(0))
        self.hist_count.index_copy_(0, ring, count.unsqueeze(0))
        self.hist_nodes.index_copy_(0, ring, tree.n_nodes.unsqueeze(0))
        self.hist_prefix.index_copy_(0, ring, L32.unsqueeze(0))
        # state update, in place
        self.prefix.add_(count.to(torch.int32))
        if self._contiguous:
            cache.lengths[: self.B].copy_(self.prefix)
        else:
            cache.lengths.index_copy_(0, self._reqs_dev, self.prefix)
        self.bonus.copy_(torch.where(self.active, acc.bonus, self.bonus))
        # max_new_tokens reached: commit nothing more until the host sync marks it done
        self.left.sub_(count)
        self.active.logical_and_(self.left > 0)
        self.step_dev.add_(1)

    # ------------------------------------------------------------------ host side

    def _prepare_window(self) -> None:
        """Before a window of up to ``sync_every`` steps: pages ahead, fresh uniforms.

        Every step writes ``T`` verify rows at the request's prefix (finished requests too) and
        advances an active one by at most ``P``; an active request stops advancing once its
        ``max_new_tokens`` are in (at most ``left - 1 + P`` past the window's start). Each
        request gets pages for its worst case; the window is shortened where the page table
        cannot hold ``sync_every`` steps of it (never for states from ``engine.prefill``)."""
        st = self.state
        cache = st.cache
        lengths = [int(x) for x in self.prefix.tolist()]
        left = self._left_host()
        cap = cache.max_pages_per_req * cache.page_size
        S, P, T = self.sync_every, self.P, self.T
        adv_cap, window = [], S
        for b, n in enumerate(lengths):
            room = cap - n
            if room < T:
                raise RuntimeError(
                    f"KV cache full: request {self.reqs[b]} holds {n} tokens, the next step "
                    f"needs {T} more slots but only {room} fit its page table"
                )
            most = 0 if st.done[b] else left[b] - 1 + P  # furthest advance before stopping
            adv_cap.append(most)
            if most + T > room:
                window = min(window, max(1, (room - T) // P))
        need = [
            min(cap - n, min(window * P, a) + T) for n, a in zip(lengths, adv_cap, strict=True)
        ]
        reserve_ahead(cache, self.reqs, lengths, 0)  # records the committed lengths
        cache.reserve(self.reqs, need)
        self._window = window
        if self.engine.temperature > 0:
            self.uniforms.copy_(torch.rand(self.uniforms.shape, generator=self._ugen))

    def _sync(self) -> None:
        """Stream the window's tokens out, apply stop/length limits, prepare the next one."""
        n = self._steps_done
        if n == 0:
            return
        st = self.state
        start = (self._total_steps - n) % self.sync_every
        order = torch.tensor([(start + i) % self.sync_every for i in range(n)])
        toks = self.hist_tokens.cpu()[order].tolist()
        counts = self.hist_count.cpu()[order].tolist()
        nodes = self.hist_nodes.cpu()[order].tolist()
        prefix = self.hist_prefix.cpu()[order].tolist()
        for i in range(n):
            active = [b for b in range(self.B) if not st.done[b]]
            emitted = {}
            for b in active:
                out, kept = st.tokens[b], 0
                for t in toks[i][b][: counts[i][b]]:
                    if st.max_new_tokens is not None and len(out) >= st.max_new_tokens:
                        break
                    out.append(int(t))
                    kept += 1
                    if t in st.stop_tokens:
                        st.done[b] = True
                        break
                if st.max_new_tokens is not None and len(out) >= st.max_new_tokens:
                    st.done[b] = True
                emitted[b] = kept
                st.bonus[b] = int(toks[i][b][counts[i][b] - 1])
            if active:
                self.records.append(
                    StepRecord(
                        step=st.step_index,
                        mode=self.kind,
                        batch_index=tuple(active),
                        tree_size=tuple(nodes[i][b] for b in active),
                        accepted_len=tuple(counts[i][b] for b in active),
                        bonus_token=tuple(st.bonus[b] for b in active),
                        emitted=tuple(emitted[b] for b in active),
                        context_len=tuple(prefix[i][b] for b in active),
                        phase_ms={},
                    )
                )
            st.step_index += 1
        self.active.copy_(torch.tensor([not d for d in st.done], dtype=torch.bool))
        self.left.copy_(torch.tensor(self._left_host(), dtype=torch.int64))
        self._steps_done = 0
        self._prepare_window()

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step_body()
        self.graph = graph

    @torch.no_grad()
    def step(self) -> None:
        """Run one step (eager, capture+replay, or replay); sync the host every window."""
        if all(self.state.done):
            raise RuntimeError("step: every request of this state has finished")
        if self.mode == "eager" or self._total_steps < self.warmup:
            if self.mode == "graph":  # warm-up steps run on a side stream, as capture wants
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    self._step_body()
                torch.cuda.current_stream(self.device).wait_stream(side)
            else:
                self._step_body()
        else:
            if self.graph is None:
                self._capture()
            self.graph.replay()
        profiler_step()
        self._steps_done += 1
        self._total_steps += 1
        if self._steps_done >= self._window:
            self._sync()

    @torch.no_grad()
    def run(self, max_steps: int) -> list[list[int]]:
        """Step until every request is done or ``max_steps`` steps ran; returns the tokens."""
        for _ in range(max_steps):
            if all(self.state.done):
                break
            self.step()
        self.flush()
        return self.state.tokens

    def flush(self) -> None:
        """Sync now (stream out whatever the current window holds)."""
        self._sync()
