"""Bytes and FLOPs of decode passes and rounds, and a roofline cost model.

At small batch a decode pass is bound by memory bandwidth: it reads every
weight once, and its FLOPs are about two per weight per token. The roofline
time of a pass on a device is

    max(bytes / read bandwidth, FLOPs / peak FLOP/s),

which needs no timing on that device, so it transfers to a GPU or TPU that
the host has never seen (`ACCELERATORS`), where the timed cost model
(`specjax.harness.measure`) cannot.

Two counts of a pass, side by side:

* `pass_cost`: an analytic count for a `TransformerLM` (or a `SelfDraft`),
  from its config and parameter arrays. Bytes: every weight once (the
  embedding tables at the rows gathered, and a tied one whole, by the
  head), the whole KV cache of every layer at the cache's capacity
  (attention reads the fixed-size buffer, masked, not only the filled
  slots), the new keys and values written, the float32 logits written.
  FLOPs: 2 per weight per scored token in the blocks and the head, and 4
  per (query, key slot, head feature) in attention.
  Activations, norms and sampling are left out; they are small next to the
  weights at decode shapes.
* `xla_pass_cost`: XLA's own cost analysis of the same pass, compiled as a
  loop body with the cache carried, as the decode loop runs it.

XLA charges an in-place scatter its whole buffer read and written, and a
gather of several rows its whole table, so a pass's XLA bytes exceed the
physical count by twice the KV cache and the tables even with no copy;
`pass_cost(..., xla_conventions=True)` counts the same way. `loop_copies`
counts the whole-buffer copies themselves in the optimized HLO of the
compiled generation.

A round (`ar_step`, `chain_round`, `round_passes` for any loop shape) is a
list of named passes; `round_seconds` sums their roofline times, and
`round_counts` sets a compiled round's XLA count beside them.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import coupling
from specjax import sampling as sampling_lib
from specjax.decode import draft_length as draft_length_lib
from specjax.decode import loop
from specjax.decode import verifiers as verifiers_lib
from specjax.harness import measure
from specjax.models import TransformerLM
from specjax.models import protocol
from specjax.models.self_draft import SelfDraft


@dataclasses.dataclass(frozen=True)
class Cost:
  """Bytes moved (read + written) and FLOPs of one pass or round."""
  bytes: float
  flops: float

  def __add__(self, other: Cost) -> Cost:
    return Cost(self.bytes + other.bytes, self.flops + other.flops)

  def __mul__(self, n: float) -> Cost:
    return Cost(self.bytes * n, self.flops * n)

  __rmul__ = __mul__


@dataclasses.dataclass(frozen=True)
class Device:
  """What a roofline needs of a device: read bandwidth and peak FLOP/s.

  Attributes:
    name: what tables print.
    bytes_per_s: memory read bandwidth.
    flops_per_s: dense peak FLOP/s at the dtype the predictions assume.
    source: where the numbers come from.
  """
  name: str
  bytes_per_s: float
  flops_per_s: float
  source: str

  def __post_init__(self):
    for field in ("bytes_per_s", "flops_per_s"):
      value = getattr(self, field)
      if (isinstance(value, bool) or not isinstance(value, (int, float))
          or not np.isfinite(value) or value <= 0):
        raise ValueError(f"Device {field} must be a positive number, got "
                         f"{value!r}.")

  def seconds(self, cost: Cost) -> float:
    """The roofline time of `cost` on this device."""
    return max(cost.bytes / self.bytes_per_s, cost.flops / self.flops_per_s)


# Dense bf16 peaks (the datasheets quote H100/H200 tensor FLOP/s with 2:4
# sparsity; half of that is dense) and peak memory bandwidth.
ACCELERATORS: dict[str, Device] = {
    "H100 SXM": Device(
        "H100 SXM", 3.35e12, 989e12,
        "NVIDIA H100 Tensor Core GPU datasheet: 3.35 TB/s HBM3; BF16 "
        "1,979 TFLOPS with sparsity"),
    "H200 SXM": Device(
        "H200 SXM", 4.8e12, 989e12,
        "NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s HBM3e; BF16 "
        "1,979 TFLOPS with sparsity"),
    "TPU v5e": Device(
        "TPU v5e", 819e9, 197e12,
        "Google Cloud TPU v5e documentation: 819 GBps HBM2; 197 TFLOPs "
        "bf16 per chip"),
    "TPU v6e": Device(
        "TPU v6e", 1638e9, 918e12,
        "Google Cloud TPU v6e documentation: 1638 GBps HBM; 918 TFLOPs "
        "bf16 per chip"),
}


def get_device(device: Device | str) -> Device:
  """`device` itself, or the named entry of `ACCELERATORS` (case and spaces
  ignored: "h100 sxm", "H100SXM" and "H100 SXM" are one device)."""
  if isinstance(device, Device):
    return device
  if isinstance(device, str):
    wanted = device.replace(" ", "").lower()
    for name, known in ACCELERATORS.items():
      if name.replace(" ", "").lower() == wanted:
        return known
  raise ValueError(
      f"device must be a specjax.harness.roofline.Device or one of "
      f"{sorted(ACCELERATORS)}, got {device!r}; for another device, pass "
      f"Device(name, bytes_per_s, flops_per_s, source).")


def cpu_model() -> str:
  """This host's CPU model ('model name' in /proc/cpuinfo, else what
  `platform` knows), for the header of a timing table."""
  try:
    with open("/proc/cpuinfo") as fh:
      for line in fh:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"


def read_probe(megabytes: int) -> tuple[Callable[[], Any], int]:
  """A call that reads `megabytes` MB (a jitted `jnp.sum` over a float32
  array, compiled here) and the bytes it reads: this device's read
  bandwidth is the bytes over the call's fastest time."""
  megabytes = _checks.check_int("megabytes", megabytes, low=1)
  x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  return (lambda: total(x)), x.nbytes


def rows_probe(rows: int, *, d_in: int = 768, d_out: int = 3072,
               layers: int = 12) -> tuple[Callable[[], Any], int]:
  """A call that multiplies `rows` rows by each of `layers` distinct
  float32 `[d_in, d_out]` matrices, as a decode pass on `rows` tokens
  multiplies them by its weights, and the bytes of the matrices it reads.
  Timed beside `read_probe`, it shows how much of the read bandwidth the
  device's matrix products reach at that many rows (a verify pass scores
  gamma + 1 tokens, a decode step one)."""
  rows = _checks.check_int("rows", rows, low=1)
  weights = [jnp.full((d_in, d_out), 1e-3 * (i + 1), jnp.float32)
             for i in range(_checks.check_int("layers", layers, low=1))]
  x_RxD = jnp.ones((rows, d_in), jnp.float32)

  @jax.jit
  def products(weights, x_RxD):
    return sum(x_RxD @ w for w in weights)  # each matrix read once

  products(weights, x_RxD).block_until_ready()
  return (lambda: products(weights, x_RxD)), sum(w.nbytes for w in weights)


def host_reading(megabytes: int = 256, calls: int = 10) -> dict[str, Any]:
  """The host a timing table ran on: its CPU model, cores, and read
  bandwidth (GB/s, the fastest of `calls` turns of `read_probe`)."""
  read, read_bytes = read_probe(megabytes)
  best = min(measure.interleaved_times({"read": read}, calls)["read"])
  return {"cpu": cpu_model(), "cores": os.cpu_count(),
          "read_gb_per_s": read_bytes / best / 1e9}


def _layout(model: Any):
  """(config, {path: array}) of what a pass of `model` reads: a
  `TransformerLM`'s own, or a `SelfDraft`'s kept blocks of its target (with
  the target's embeddings, final norm and head, and its exit adapter)."""
  if isinstance(model, TransformerLM):
    return model.config, _leaves(model.state)
  if isinstance(model, SelfDraft):
    blocks = "['blocks']"
    kept = {f"{blocks}[{i}]" for i in model.layers}
    # A block's arrays are at "['blocks'][i]...": keep the kept blocks'.
    leaves = {k: x for k, x in _leaves(model.target.state).items()
              if not k.startswith(blocks)
              or k[:k.index("]", len(blocks)) + 1] in kept}
    if model.adapter is not None:
      leaves.update({f"['adapter']{k}": x for k, x in
                     _leaves(model.adapter).items()})
    return (dataclasses.replace(model.target.config,
                                num_layers=len(model.layers)), leaves)
  raise TypeError(
      f"the analytic count takes a TransformerLM or a SelfDraft, got "
      f"{type(model).__name__}; use xla_pass_cost for any other model.")


def has_analytic_count(model: Any) -> bool:
  """Whether `pass_cost` counts `model` (a `TransformerLM` or a
  `SelfDraft`); `xla_pass_cost` counts any `CausalLM`."""
  return isinstance(model, (TransformerLM, SelfDraft))


def _check_shape(batch_size, num_tokens, capacity, num_queries):
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  num_tokens = _checks.check_int("num_tokens", num_tokens, low=1)
  capacity = _checks.check_int("capacity", capacity, low=num_tokens)
  num_queries = num_tokens if num_queries is None else _checks.check_int(
      "num_queries", num_queries, low=1, high=num_tokens)
  return batch_size, num_tokens, capacity, num_queries


def _leaves(tree) -> dict[str, Any]:
  return {jax.tree_util.keystr(path): leaf for path, leaf in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


def pass_cost(model: Any, *, batch_size: int, num_tokens: int,
              capacity: int, num_queries: int | None = None,
              xla_conventions: bool = False) -> Cost:
  """The analytic bytes and FLOPs of one cached forward pass.

  Args:
    model: a `TransformerLM` (any flavour, dtype, tied or untied head), or
      a `SelfDraft` of one (its kept blocks, on its own or the target's
      cache: the same bytes).
    batch_size: rows B.
    num_tokens: new tokens T per row (1 for a decode step, gamma + 1 for a
      chain's verify pass, the node count for a tree's).
    capacity: the KV cache's slots per row S (>= num_tokens).
    num_queries: tokens scored by the last block and the head (a prefill
      scores fewer than it writes); default all T.
    xla_conventions: count as XLA's cost analysis does: an in-place cache
      write as its whole buffer read and written, a gather of more than
      one row as its whole table read. The bytes then differ from
      `xla_pass_cost`'s only by what neither counts as a weight or the
      cache (activations) and by copies.

  Returns:
    `Cost` of the pass; see the module docstring for what is counted.
  """
  c, leaves = _layout(model)
  b, t, s, q = _check_shape(batch_size, num_tokens, capacity, num_queries)
  # Every array once; the gathered tables (token and position embeddings)
  # at the rows the pass reads, or, as XLA charges a gather of more than
  # one row, whole (a tied token table then counts twice: gather and head).
  weight_bytes = sum(x.nbytes for x in leaves.values())
  for k, table in leaves.items():
    if not k.startswith(("['embed']", "['pos_embed']")):
      continue
    read_by_head = k.startswith("['embed']") and c.tie_embeddings
    gathered = (table.nbytes if xla_conventions and t > 1
                else b * t * (table.nbytes // table.shape[0]))
    weight_bytes += gathered - (0 if read_by_head else table.nbytes)
  kv_item = jnp.dtype(c.dtype).itemsize
  kv_row = 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_item
  cache_bytes = b * s * kv_row + (  # attention reads it all; the write:
      2 * b * s * kv_row if xla_conventions else b * t * kv_row)
  logits_bytes = b * q * c.vocab_size * 4
  # Matmul weights of the blocks (kernels: 2-D arrays outside the tables).
  block_weights = sum(
      x.size for k, x in leaves.items()
      if x.ndim == 2 and not k.startswith(("['embed']", "['pos_embed']",
                                           "['lm_head']")))
  head_weights = c.d_model * c.vocab_size
  # Scored tokens: all T in every block but the last, Q in the last.
  per_block = block_weights / c.num_layers
  tokens_through = b * (t * (c.num_layers - 1) + q)
  attention = 4 * b * c.num_heads * c.head_dim * (
      t * (c.num_layers - 1) + q) * s
  flops = 2 * per_block * tokens_through + 2 * b * q * head_weights + attention
  return Cost(float(weight_bytes + cache_bytes + logits_bytes), float(flops))


def xla_pass_cost(model, *, batch_size: int, num_tokens: int,
                  capacity: int,
                  compiler_options: dict[str, Any] | None = None) -> Cost:
  """XLA's cost analysis of one cached forward pass of any `CausalLM`.

  The pass is compiled as the body of a loop that carries the cache (as
  the decode loop runs it; a trip count unknown to XLA, which counts the
  body once). Bytes are XLA's 'bytes accessed'; see the module docstring
  for how its count of an in-place cache write differs from the analytic
  one. `compiler_options` go to `compile()` (XLA debug options, e.g.
  {"xla_cpu_use_fusion_emitters": True}); the count depends on them.
  """
  b, t, s, _ = _check_shape(batch_size, num_tokens, capacity, None)
  tokens_BxT = jnp.zeros((b, t), jnp.int32)

  def run(model, cache, n):
    def body(_, carry):
      cache, acc_B = carry
      logits_BxTxV, cache = model(tokens_BxT, cache)
      # Rewind, so every trip is the same pass at the same cache length.
      return (cache.replace(lengths=cache.lengths - t),
              acc_B + logits_BxTxV[:, -1, 0])
    return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((b,))))

  cache = model.init_cache(b, s)
  compiled = jax.jit(run, donate_argnums=1).lower(model, cache, 2).compile(
      compiler_options)
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
    analysis = analysis[0]
  return Cost(float(analysis["bytes accessed"]), float(analysis["flops"]))


def _check_round(draft, gamma, verifier, sampling, draft_length, width):
  """(verifier, gamma, width) of the round `xla_round_cost` compiles, each
  checked: the verifier (None for `generate`'s step), the loop's gamma (a
  tree's depth, a rule's gamma_max) and a planning rule's width."""
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError(f"sampling must be a specjax.SamplingConfig, got "
                    f"{sampling!r}.")
  if draft_length is not None and not isinstance(draft_length,
                                                 draft_length_lib.Rule):
    raise TypeError(f"draft_length must be a draft-length rule "
                    f"(specjax.Confidence, specjax.Goodput), got "
                    f"{draft_length!r}.")
  if draft is None:
    if draft_length is not None or width is not None:
      raise ValueError("generate's step (draft None) has no draft-length "
                       "rule or width.")
    return None, 0, None
  verifier = verifiers_lib.get_verifier(verifier)
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    gamma = verifier.depth
  elif draft_length is not None:
    gamma = draft_length.gamma_max
  else:
    gamma = _checks.check_int("gamma", gamma, low=1)
  if draft_length is not None and not draft_length.stops_early:
    width = _checks.check_int("width", width, low=1,
                              high=draft_length.gamma_max)
  elif width is not None:
    raise ValueError("width is the round of a draft-length rule that plans; "
                     "leave it out for this round.")
  return verifier, gamma, width


def xla_round_cost(target, draft=None, *, batch_size: int, prompt_len: int,
                   max_new_tokens: int, gamma: int = 0,
                   verifier: Any = "token",
                   sampling: sampling_lib.SamplingConfig = (
                       sampling_lib.SamplingConfig()),
                   draft_length: Any = None, width: int | None = None,
                   compiler_options: dict[str, Any] | None = None) -> Cost:
  """XLA's cost analysis of one round of the compiled decode loop.

  The round is the one `speculative_generate(target, draft, ...)` runs for
  int prompts `[batch_size, prompt_len]` (`generate`'s step with draft
  None): gamma drafts under `verifier`, a tree's round under a tree
  verifier (gamma is then its depth), or a `draft_length` rule's round
  (gamma is then its gamma_max; a rule that plans, rather than stops,
  runs its round at `width`, 1..gamma_max, as `_planned_loop` does).
  It is compiled as the body of a loop that carries the decode state, as
  the real loop runs it, with XLA's conventions (see the module
  docstring): a nested loop's body (the draft's one-token steps of a
  chain round) is counted once, whatever its trip count.
  `round_counts` counts the passes of the same round the same way
  ("analytic_xla"), so the difference is the round's work outside the
  model passes (sampling, verification, the commit) and any copy.
  """
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  prompt_len = _checks.check_int("prompt_len", prompt_len, low=1)
  max_new_tokens = _checks.check_int("max_new_tokens", max_new_tokens, low=1)
  verifier, gamma, width = _check_round(draft, gamma, verifier, sampling,
                                        draft_length, width)
  prompts_BxP = jnp.zeros((batch_size, prompt_len), jnp.int32)
  lengths_B = jnp.full((batch_size,), prompt_len, jnp.int32)
  keys_B = jax.random.split(jax.random.key(0), batch_size)
  static = dict(gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling,
                verifier=verifier, draft_length=draft_length, constraint=None)
  # pylint: disable=protected-access
  state = jax.eval_shape(
      lambda t, d: loop._start(t, d, prompts_BxP, lengths_B, keys_B,
                               **static), target, draft)

  def run(target, draft, state, n):
    round_ = lambda _, s: loop._round(
        s, target=target, draft=draft, eos_id=None,
        coupling_rule=coupling._coupling,
        **({"width": width} if width is not None else {}), **static)
    return jax.lax.fori_loop(0, n, round_, state)
  # pylint: enable=protected-access
  compiled = jax.jit(run, donate_argnums=2).lower(
      target, draft, state, 2).compile(compiler_options)
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
    analysis = analysis[0]
  return Cost(float(analysis["bytes accessed"]), float(analysis["flops"]))


def count(model, *, batch_size: int, num_tokens: int, capacity: int) -> Cost:
  """A pass's cost: the analytic count where there is one
  (`has_analytic_count`), else XLA's (`xla_pass_cost`)."""
  counter = pass_cost if has_analytic_count(model) else xla_pass_cost
  return counter(model, batch_size=batch_size, num_tokens=num_tokens,
                 capacity=capacity)


def ar_step() -> list[tuple[str, int, int]]:
  """`generate`'s step: one target pass on one token. Entries are
  (model role, tokens, passes)."""
  return [("target", 1, 1)]


def chain_round(gamma: int, first_tokens: int = 2
                ) -> list[tuple[str, int, int]]:
  """A chain round of width gamma (token or block verification): the
  draft's first pass (its two-token window; 1 token for a draft on the
  target's cache), gamma - 1 one-token steps, and the target's verify pass
  on gamma + 1 tokens. Entries are (model role, tokens, passes)."""
  gamma = _checks.check_int("gamma", gamma, low=1)
  first_tokens = _checks.check_int("first_tokens", first_tokens, low=1)
  round_ = [("draft", first_tokens, 1)]
  if gamma > 1:
    round_.append(("draft", 1, gamma - 1))
  return round_ + [("target", gamma + 1, 1)]


def round_passes(draft: Any = None, *, gamma: int = 0,
                 verifier: Any = "token", draft_length: Any = None,
                 width: int | None = None) -> list[tuple[str, int, int]]:
  """The passes of one round of the loop `speculative_generate` runs for
  `draft` (draft None: `generate`'s step): a chain round of gamma drafts
  (`chain_round`); a draft-length rule's, at `width` for a rule that
  plans, else at its gamma_max (the most it drafts); or a tree verifier's
  round, its draft scoring the root (as a chain's first pass) and then, at
  each depth, the nodes that have children, in one pass. Entries are
  (model role, tokens, passes)."""
  if draft is None:
    return ar_step()
  first = 1 if getattr(draft, "reads_target_cache", False) else 2
  verifier = verifiers_lib.get_verifier(verifier)
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    topology = verifier.topology
    # Nodes with children, per depth (the root's, depth 0, is the first).
    parents = sorted({p for p in topology.parents if p >= 0})
    internal = np.bincount(np.asarray(topology.depth, int)[parents],
                           minlength=topology.max_depth + 1)
    return ([("draft", first, 1)]
            + [("draft", int(n), 1) for n in internal[1:] if n]
            + [("target", topology.num_nodes + 1, 1)])
  if draft_length is not None:
    gamma = draft_length.gamma_max if width is None else width
  return chain_round(gamma, first)


def as_xla_counts(passes) -> list[tuple[str, int, int]]:
  """`passes` as XLA's cost analysis counts a compiled round: a loop
  body once, whatever its trip count, so each entry at most once (a chain
  round's one-token draft steps are one loop)."""
  return [(role, tokens, min(count, 1)) for role, tokens, count in passes]


def round_cost(passes, models: dict[str, Any], *, batch_size: int,
               capacity: int, counter=None) -> dict[str, Cost]:
  """The cost of each entry of a round (`ar_step`, `chain_round`,
  `round_passes`) and their sum under 'round'.

  `models` maps the roles ('target', 'draft') to models; `counter` is
  `pass_cost` (default) or `xla_pass_cost`.
  """
  counter = counter or pass_cost
  costs, total = {}, Cost(0.0, 0.0)
  for role, tokens, count in passes:
    if role not in models:
      raise ValueError(f"round_cost: the round needs a {role!r} model; pass "
                       f"models={{'{role}': ...}}.")
    one = counter(models[role], batch_size=batch_size, num_tokens=tokens,
                  capacity=capacity)
    costs[f"{role} T={tokens} x{count}"] = one * count
    total = total + one * count
  costs["round"] = total
  return costs


def round_counts(target, draft=None, *, batch_size: int, prompt_len: int,
                 max_new_tokens: int, gamma: int = 0, verifier: Any = "token",
                 sampling: sampling_lib.SamplingConfig = (
                     sampling_lib.SamplingConfig()),
                 draft_length: Any = None, width: int | None = None,
                 compiler_options: dict[str, Any] | None = None
                 ) -> dict[str, Cost]:
  """One round of the compiled loop, counted three ways (arguments as
  `xla_round_cost`; `prompt_len` on a bucket boundary, as the loop pads
  prompts to one, `loop.prompt_bucket`):

    "analytic": its passes (`round_passes`), each counted by `pass_cost`;
    "analytic_xla": the same under XLA's conventions (`pass_cost(...,
      xla_conventions=True)`, each loop body once: `as_xla_counts`);
    "xla": XLA's cost analysis of the compiled round (`xla_round_cost`).

  "xla" less "analytic_xla" is what the round moves outside its model
  passes: the sampling and verification work on the [B, T, V] logits, the
  commit, and any copy. Needs an analytic count of both models
  (`has_analytic_count`).
  """
  verifier_, gamma, width = _check_round(draft, gamma, verifier, sampling,
                                         draft_length, width)
  for role, model in (("target", target), ("draft", draft)):
    if model is not None and not has_analytic_count(model):
      raise TypeError(f"round_counts counts a TransformerLM or a SelfDraft; "
                      f"the {role} is a {type(model).__name__}. Use "
                      f"xla_round_cost for it.")
  xla = xla_round_cost(target, draft, batch_size=batch_size,
                       prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                       gamma=gamma, verifier=verifier, sampling=sampling,
                       draft_length=draft_length, width=width,
                       compiler_options=compiler_options)
  # pylint: disable=protected-access
  buffer_len = loop._buffer_len(loop.prompt_bucket(prompt_len),
                                max_new_tokens, gamma, verifier_)
  # pylint: enable=protected-access
  passes = round_passes(draft, gamma=gamma, verifier=verifier,
                        draft_length=draft_length, width=width)
  models = {"target": target, "draft": draft}
  out = {}
  for name, counted, conventions in (("analytic", passes, False),
                                     ("analytic_xla", as_xla_counts(passes),
                                      True)):
    out[name] = Cost(0.0, 0.0)
    for role, tokens, count in counted:
      out[name] = out[name] + count * pass_cost(
          models[role], batch_size=batch_size, num_tokens=tokens,
          capacity=protocol.cache_length(models[role], buffer_len),
          xla_conventions=conventions)
  out["xla"] = xla
  return out


def round_seconds(costs: dict[str, Cost], device: Device) -> float:
  """Roofline seconds of a round: each pass's roofline time, summed (the
  passes run one after another)."""
  return sum(device.seconds(c) for name, c in costs.items()
             if name != "round")


def call_costs(passes, models: dict[str, Any], *, batch_size: int,
               capacity: int, prompt_len: int
               ) -> tuple[dict[str, Cost], dict[str, Cost]]:
  """(prefill costs, round costs) of one decode call: `generate`'s (models
  holds only the target) or `speculative_generate`'s, whose draft
  prefills too unless it reads the target's cache; a round is `passes`
  (`ar_step`, `round_passes`). Each pass is counted by `count`."""
  prefill = [("target", prompt_len, 1)]
  draft = models.get("draft")
  if draft is not None and not getattr(draft, "reads_target_cache", False):
    prefill.append(("draft", prompt_len, 1))
  shape = dict(batch_size=batch_size, capacity=capacity, counter=count)
  return (round_cost(prefill, models, **shape),
          round_cost(passes, models, **shape))


def call_seconds(prefill: dict[str, Cost], round_: dict[str, Cost],
                 rounds: float, device: Device) -> float:
  """Roofline seconds of a call: its prefills and `rounds` rounds
  (`call_costs`) on `device`."""
  return (round_seconds(prefill, device)
          + rounds * round_seconds(round_, device))


def host_probes(read_mb: int) -> tuple[dict[str, Callable[[], Any]],
                                       Callable[[dict], Device]]:
  """Calls that probe this host's read bandwidth (`read_probe` over
  `read_mb` MB) and matmul FLOP/s (a 2048^3 float32 matmul), to be timed
  beside the decodes (`measure.interleaved_times`), and the function that
  turns their times into this host's roofline `Device` (from the fastest
  call of each)."""
  read, read_bytes = read_probe(read_mb)
  a = jnp.ones((2048, 2048), jnp.float32)
  matmul = jax.jit(lambda a: a @ a)
  matmul(a).block_until_ready()

  def device(times):
    return Device(
        jax.devices()[0].device_kind, read_bytes / min(times["read probe"]),
        2 * 2048**3 / min(times["matmul probe"]),
        f"measured beside the decodes: jnp.sum over {read_mb} MB, a "
        "2048^3 float32 matmul")

  return {"read probe": read, "matmul probe": lambda: matmul(a)}, device


# ----------------------------------------------------- whole-buffer copies --


def _computations(hlo_text: str) -> dict[str, list[str]]:
  comps, current = {}, None
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
    if header and not line.startswith(" ") and line.rstrip().endswith("{"):
      current = header.group(1)
      comps[current] = []
    elif current is not None:
      comps[current].append(line)
  return comps


def loop_copies(hlo_text: str, shapes: Sequence[Sequence[int]]) -> int:
  """Copies of whole arrays of any of `shapes` inside loop bodies.

  Counts `copy` instructions whose result has one of `shapes` in every
  computation a `while` body reaches (its fusions and nested loops), in
  optimized HLO text (`jax.jit(f).lower(...).compile().as_text()`). With
  the KV cache's layer shapes, a nonzero count is a whole-cache copy every
  round.
  """
  comps = _computations(hlo_text)
  todo = re.findall(r"body=%?([\w.\-]+)", hlo_text)
  seen: set[str] = set()
  while todo:
    name = todo.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    for line in comps[name]:
      for refs in re.findall(
          r"(?:calls|to_apply|body|condition|branch_computations)="
          r"\{?((?:%?[\w.\-]+(?:, )?)+)\}?", line):
        todo.extend(r.strip().lstrip("%") for r in refs.split(","))
  wanted = {",".join(str(int(d)) for d in shape) for shape in shapes}
  pattern = re.compile(r"= \w+\[([\d,]*)\](?:\{[^}]*\})? copy\(")
  return sum(1 for name in seen for line in comps[name]
             for m in [pattern.search(line)] if m and m.group(1) in wanted)


def cache_copies_per_round(target, draft=None, *, batch_size: int,
                           prompt_len: int, max_new_tokens: int,
                           gamma: int = 0, verifier: Any = "token",
                           sampling: sampling_lib.SamplingConfig = (
                               sampling_lib.SamplingConfig()),
                           compiler_options: dict[str, Any] | None = None
                           ) -> int:
  """Whole-buffer copies of a KV cache layer in one compiled generation's
  loop bodies: `generate`'s (draft None) or `speculative_generate`'s.

  The program is the one those calls compile for int prompts
  `[batch_size, prompt_len]` (a `prompt_len` on a bucket boundary;
  `loop.prompt_bucket`), compiled with `compiler_options`; the count is
  `loop_copies` over the target's cache layer shape (and the draft's, for
  a `TransformerLM` draft). 0 means no round copies a cache.
  """
  batch_size = _checks.check_int("batch_size", batch_size, low=1)
  prompt_len = _checks.check_int("prompt_len", prompt_len, low=1)
  max_new_tokens = _checks.check_int("max_new_tokens", max_new_tokens, low=1)
  verifier = None if draft is None else verifiers_lib.get_verifier(verifier)
  if isinstance(verifier, verifiers_lib.TreeVerifier):
    gamma = verifier.depth
  gamma = 0 if draft is None else _checks.check_int("gamma", gamma, low=1)
  prompts_BxP = jnp.zeros((batch_size, prompt_len), jnp.int32)
  lengths_B = jnp.full((batch_size,), prompt_len, jnp.int32)
  keys_B = jax.random.split(jax.random.key(0), batch_size)
  lowered = loop._generate.lower(  # pylint: disable=protected-access
      target, draft, prompts_BxP, lengths_B, keys_B, gamma=gamma,
      max_new_tokens=max_new_tokens, sampling=sampling, eos_id=None,
      pad_id=0, verifier=verifier)
  slots = loop._buffer_len(  # pylint: disable=protected-access
      prompt_len, max_new_tokens, gamma, verifier)
  shapes = {(batch_size, c.num_kv_heads, slots, c.head_dim)
            for c in (_layout(m)[0] for m in (target, draft)
                      if has_analytic_count(m))}
  return loop_copies(lowered.compile(compiler_options).as_text(),
                     sorted(shapes))
