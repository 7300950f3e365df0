"""A byte-level draft proposing the target's tokens by their exact law (SLRS).

String-level rejection sampling, SLRS (Timor et al., ICML 2025,
"Accelerating LLM Inference with Lossless Speculative Decoding Algorithms
for Heterogeneous Vocabularies"): the draft writes text, the text's first
target token is the proposal, and the proposal is judged by rejection
sampling against psi, the probability that the draft's text yields that
token. `StringRejectionDraft` wraps a byte-level draft so that it is a
`CausalLM` over the TARGET's ids whose logits are log psi: the loop draws
the proposal from psi and every chain verifier judges it against the same
law, so the output is an exact sample of the target under any sampling
transform, and q is soft (kept with probability sum min(p, psi), where a
point-mass proposal, `StringLevelDraft`, is kept with p(x)).

The law psi. Text begins with a target token in many ways at once ("a" and
"ab" both begin "abc"), so psi is the law of a fixed cut: the longest
target token the text begins with, where the text's bytes are drawn from
the draft. Over the trie of the target's tokens (each node a byte string
that begins some token), m(s), the draft's probability that the text
begins with s, is the product of its byte probabilities along s. At a
node the text either continues down the trie or leaves it (a byte no token
continues with, or the draft's EOS); the mass that leaves at s goes to the
longest token s begins with. psi sums to one over the target's tokens
whatever the draft is; the draft's EOS at the root goes to the target's
EOS. Bytes with no target token and no draft text (other special ids) are
dropped and psi renormalised.

Cost, and the bound. The draft's byte laws at the trie's nodes come from
one tree pass (`tree_decode`, the trie's nodes as a static draft tree) per
proposal, after reading the proposal's bytes. The trie of a real
vocabulary has hundreds of nodes, so only `max_nodes` of them are scored:
the ones whose extensions are the target's lowest ids (a BPE's earliest,
most frequent merges), shallower first, so the set is closed under
prefixes. At a node that is not scored the text's further bytes are
unknown and all of its mass goes to the longest token it begins with: the
cut then looks no further, psi is still its exact law, and only how close
psi is to the target's own law changes.

The pre-tokenizer. A BPE cuts text into words before merging; GPT-2's
split (and Llama 3's) keeps a run of whitespace apart from the word after
it except for the run's last character. A token of whitespace is then
followed by whitespace or the text's end, never by a word. With
`split_whitespace`, the cut follows that rule: at a scored node it looks at
the next byte, and a whitespace token followed by a non-whitespace byte is
not taken, so the cut's first token is more often the BPE's own.

Why byte-level drafts only. psi(t) is then a product along t's bytes. A
draft with multi-byte tokens writes the same text in many segmentations,
and psi would sum over all of them; such a draft is refused (use
`TokenIntersectionDraft` or `StringLevelDraft`).

Reading. Each target token is read as its bytes (`token_intersection.
read`, the last `max_per_token` of them); the tree's slots follow the
read text and are overwritten by the next read.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import _checks
from specjax.data.token_bytes import token_bytes
from specjax.models import protocol
from specjax.models import token_intersection
from specjax.models.token_intersection import IntersectionCache
from specjax.models.vocab import MASKED_LOGIT

WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")
# GPT-2's (and Llama 3's, cl100k's) pre-tokenizer keeps a whitespace run
# apart from the next word but for its last character.
_RUN_PATTERN = r"\s+(?!\S)"


def splits_whitespace_runs(tokenizer: Any) -> bool:
  """Whether `tokenizer` (an `HFTokenizer`) pre-tokenizes as GPT-2 does,
  cutting a whitespace run before its last character when a word follows
  (a byte-level pre-tokenizer with its regex, or a split by that pattern)."""
  tok = getattr(tokenizer, "tokenizer", None)
  if tok is None or not hasattr(tok, "to_str"):
    return False

  def walk(node):
    if not isinstance(node, dict):
      return False
    kind = node.get("type")
    if kind == "ByteLevel":
      return bool(node.get("use_regex", True))
    if kind == "Split":
      pattern = node.get("pattern") or {}
      return _RUN_PATTERN in str(pattern.get("Regex", pattern.get("String")))
    return any(walk(n) for n in node.get("pretokenizers") or ())

  return walk(json.loads(tok.to_str()).get("pre_tokenizer"))


def _byte_ids(draft: Any, draft_tokenizer: Any) -> np.ndarray:
  """int32 `[256]`: the draft id of each byte (-1: none). Raises unless
  every draft id with text is one byte."""
  draft_bytes = token_bytes(draft_tokenizer)
  long = [i for i, b in enumerate(draft_bytes) if b and len(b) != 1]
  if long:
    raise ValueError(
        f"string-level rejection sampling needs a byte-level draft, but "
        f"draft id {long[0]} holds {draft_bytes[long[0]]!r} ({len(long)} ids "
        "hold several bytes): such a draft writes one text in many "
        "segmentations. Use TokenIntersectionDraft or StringLevelDraft for "
        "it.")
  byte_ids = np.full(256, -1, np.int32)
  for i, b in enumerate(draft_bytes):
    if b and byte_ids[b[0]] < 0:
      byte_ids[b[0]] = i
  return byte_ids


class _Trie:
  """The target tokens' trie (numpy, build time): nodes are byte strings
  that begin some token, the root b""."""

  def __init__(self, target_bytes: list[bytes | None]):
    self.token = {}  # bytes -> lowest target id with that text
    for t, b in enumerate(target_bytes):
      if b and b not in self.token:
        self.token[b] = t
    # For each node, the lowest id among the tokens that extend it.
    self.first = {b"": min(self.token.values(), default=0)}
    for b, t in self.token.items():
      for k in range(len(b)):
        self.first[b[:k]] = min(self.first.get(b[:k], t), t)
    self.nodes = set(self.first) | set(self.token)
    self.internal = set(self.first)  # nodes some longer token extends

  def scored(self, max_nodes: int) -> list[bytes]:
    """The root and the `max_nodes` internal nodes whose extensions have
    the lowest ids, shallower first: closed under prefixes (an ancestor
    is extended by every token that extends its descendant)."""
    rest = sorted((n for n in self.internal if n),
                  key=lambda n: (self.first[n], len(n), n))[:max_nodes]
    return [b""] + sorted(rest, key=lambda n: (len(n), n))

  def cut(self, s: bytes, next_ws: bool | None, split: bool) -> int:
    """The target id the text takes at node s: the longest token s begins
    with that the pre-tokenizer rule allows when the byte after s is
    whitespace or the end (next_ws True), another byte (False), or
    unknown (None: no rule at s itself). -1 when s begins no token."""
    best = fallback = -1
    for n in range(1, len(s) + 1):
      t = self.token.get(s[:n])
      if t is None:
        continue
      fallback = t
      after = (s[n] in WHITESPACE) if n < len(s) else next_ws
      if split and s[n - 1] in WHITESPACE and after is False:
        continue
      best = t
    return best if best >= 0 else fallback


class StringRejectionDraft(struct.PyTreeNode):
  """A byte-level `draft` proposing the tokens of a target of `vocab_size`
  ids by their exact law under the draft. Build with
  `StringRejectionDraft.build`.

  Attributes:
    draft, to_draft_VxL, to_draft_len_V: how the draft reads target tokens
      (`TokenIntersectionDraft`'s attributes of the same names).
    node_ids_N: int32 `[N]`: the draft id of the last byte of each scored
      non-root node (the tree's tokens), in `depth_N`/`ancestor_NxN`'s
      order.
    edge_parent_R, edge_id_R: int32 `[R]`: for each reached node (a child
      of a scored node), its scored parent (0: the root, n: node n - 1)
      and the draft id of its byte.
    scored_at_E: int32 `[E]`: each scored node's entry in R (root: -1).
    leave_ws_ExW, leave_other_ExW: float32 `[E, W]`: 1 on the draft ids
      that leave the trie at scored node e (the EOS counted as whitespace,
      but not at the root), by whether the next byte is whitespace.
    cut_ws_E, cut_other_E: int32: the target id their mass goes to (V:
      none); cut_R: where a reached node that is not scored sends its mass
      (V: none, or the node is scored).
    draft_eos, eos_id: the draft's EOS id and the target id its mass at
      the root goes to (-1: none).
    depth_N, ancestor_NxN: the tree's static layout (tuples, hashable).
    max_depth: the longest scored node's length, the passes that settle
      the reached nodes' masses.
    vocab_size: V.
  """
  draft: Any
  to_draft_VxL: jax.Array
  to_draft_len_V: jax.Array
  node_ids_N: jax.Array
  edge_parent_R: jax.Array
  edge_id_R: jax.Array
  scored_at_E: jax.Array
  leave_ws_ExW: jax.Array
  leave_other_ExW: jax.Array
  cut_ws_E: jax.Array
  cut_other_E: jax.Array
  cut_R: jax.Array
  draft_eos: int = struct.field(pytree_node=False)
  eos_id: int = struct.field(pytree_node=False)
  depth_N: Any = struct.field(pytree_node=False)
  ancestor_NxN: Any = struct.field(pytree_node=False)
  max_depth: int = struct.field(pytree_node=False)
  vocab_size: int = struct.field(pytree_node=False)

  one_hot_q = False

  @classmethod
  def build(cls, draft: Any, draft_tokenizer: Any, target_tokenizer: Any, *,
            target_vocab_size: int | None = None, max_nodes: int = 128,
            max_per_token: int = 16, split_whitespace: bool | None = None
            ) -> "StringRejectionDraft":
    """Wraps a byte-level `draft` to propose the target's tokens by psi.

    Args:
      draft: a `CausalLM` with `tree_decode` whose ids are
        `draft_tokenizer`'s, each non-special one a single byte.
      draft_tokenizer, target_tokenizer: `ByteTokenizer`s, `HFTokenizer`s
        or lists of each id's bytes (`specjax.data.token_bytes`).
      target_vocab_size: the target model's head (default: the target
        tokenizer's ids); ids past the tokenizer are never proposed.
      max_nodes: >= 0; the trie's nodes (besides the root) the draft scores
        per proposal, in one tree pass. More brings psi nearer the law of
        the full cut, at that many draft positions per proposal.
      max_per_token: as in `TokenIntersectionDraft.build`.
      split_whitespace: follow GPT-2's whitespace-run split in the cut;
        None (default): where the target tokenizer's pre-tokenizer does.

    Raises:
      TypeError when the draft has no `tree_decode`; ValueError when it is
      not byte-level, when no target token has text, or for an argument
      out of range (named).
    """
    to_draft, lengths, _, vocab, _, _ = token_intersection.reading_tables(
        draft, draft_tokenizer, target_tokenizer, target_vocab_size,
        max_per_token)
    if not protocol.supports_trees(draft):
      raise TypeError(
          f"string-level rejection sampling scores the target's token trie "
          f"as a draft tree: the draft ({type(draft).__name__}) needs a "
          "tree_decode. Use TokenIntersectionDraft or StringLevelDraft.")
    byte_ids = _byte_ids(draft, draft_tokenizer)
    max_nodes = _checks.check_int("max_nodes", max_nodes, low=0)
    if split_whitespace is None:
      split_whitespace = splits_whitespace_runs(target_tokenizer)
    elif not isinstance(split_whitespace, bool):
      raise TypeError("split_whitespace must be a bool or None, got "
                      f"{split_whitespace!r}.")
    trie = _Trie(token_bytes(target_tokenizer))
    if not trie.token:
      raise ValueError("target_tokenizer has no token with text.")
    draft_eos = getattr(draft_tokenizer, "eos_id", None)
    draft_eos = -1 if draft_eos is None else int(draft_eos)
    eos_ids = getattr(target_tokenizer, "eos_ids", ()) or ()
    eos_id = int(eos_ids[0]) if eos_ids and draft_eos >= 0 else -1

    scored = trie.scored(max_nodes)
    index = {s: e for e, s in enumerate(scored)}
    reached = sorted((s + bytes([b]) for s in scored for b in range(256)
                      if s + bytes([b]) in trie.nodes),
                     key=lambda n: (len(n), n))
    at = {s: r for r, s in enumerate(reached)}
    width = draft.vocab_size
    leave_ws = np.zeros((len(scored), width), np.float32)
    leave_other = np.zeros((len(scored), width), np.float32)
    for e, s in enumerate(scored):
      for b in np.flatnonzero(byte_ids >= 0):
        if s + bytes([b]) not in trie.nodes:
          (leave_ws if b in WHITESPACE else leave_other)[e, byte_ids[b]] = 1
      if s and draft_eos >= 0:
        leave_ws[e, draft_eos] = 1  # the text ends: whitespace may, too
    none = lambda t: vocab if t < 0 else t
    cut_ws = [none(trie.cut(s, True, split_whitespace)) if s else vocab
              for s in scored]
    cut_other = [none(trie.cut(s, False, split_whitespace)) if s else vocab
                 for s in scored]
    cut_r = [vocab if s in index else none(trie.cut(s, None,
                                                    split_whitespace))
             for s in reached]
    nodes = scored[1:]
    depth = np.array([len(s) - 1 for s in nodes], np.int32)
    ancestor = np.array([[u == s[:len(u)] for u in nodes] for s in nodes],
                        bool).reshape(len(nodes), len(nodes))
    return cls(
        draft=draft, to_draft_VxL=jnp.asarray(to_draft),
        to_draft_len_V=jnp.asarray(lengths),
        node_ids_N=jnp.asarray([byte_ids[s[-1]] for s in nodes], jnp.int32),
        edge_parent_R=jnp.asarray([index[s[:-1]] for s in reached],
                                  jnp.int32),
        edge_id_R=jnp.asarray([byte_ids[s[-1]] for s in reached], jnp.int32),
        scored_at_E=jnp.asarray([-1] + [at[s] for s in nodes], jnp.int32),
        leave_ws_ExW=jnp.asarray(leave_ws),
        leave_other_ExW=jnp.asarray(leave_other),
        cut_ws_E=jnp.asarray(cut_ws, jnp.int32),
        cut_other_E=jnp.asarray(cut_other, jnp.int32),
        cut_R=jnp.asarray(cut_r, jnp.int32), draft_eos=draft_eos,
        eos_id=eos_id, depth_N=tuple(depth.tolist()),
        ancestor_NxN=tuple(map(tuple, ancestor.tolist())),
        max_depth=int(depth.max(initial=0)) + 1, vocab_size=vocab)

  @property
  def max_per_token(self) -> int:
    return int(self.to_draft_VxL.shape[1])

  @property
  def num_nodes(self) -> int:
    """Trie nodes the draft scores per proposal (its tree pass)."""
    return int(self.node_ids_N.shape[0])

  @property
  def max_positions(self) -> int | None:
    """Target positions that surely fit the draft's context, beside the
    tree's slots."""
    limit = getattr(self.draft, "max_positions", None)
    if limit is None:
      return None
    return max(1, (limit - self.num_nodes) // self.max_per_token)

  def init_cache(self, batch_size: int, max_len: int) -> IntersectionCache:
    return IntersectionCache.create(self.draft, batch_size, max_len,
                                    self.max_per_token, margin=self.num_nodes)

  def __call__(self, tokens_BxT: jax.Array, cache: IntersectionCache
               ) -> tuple[jax.Array, IntersectionCache]:
    """Reads T target tokens; logits float32 `[B, T, V]`, log psi after the
    last of them at every position (the loop drafts from the last), and
    the cache with `lengths += T`."""
    logits_BxTxW, cache = token_intersection.read(self, tokens_BxT, cache)
    root_BxW = logits_BxTxW[:, -1]
    batch = tokens_BxT.shape[0]
    if self.num_nodes:
      nodes_BxN = jnp.broadcast_to(self.node_ids_N, (batch, self.num_nodes))
      tree_BxNxW, _ = self.draft.tree_decode(
          nodes_BxN, cache.inner, np.asarray(self.depth_N, np.int32),
          np.asarray(self.ancestor_NxN, bool).reshape(self.num_nodes,
                                                      self.num_nodes))
      logits_BxExW = jnp.concatenate(
          [root_BxW[:, None], tree_BxNxW.astype(jnp.float32)], axis=1)
    else:
      logits_BxExW = root_BxW[:, None]
    logits_BxV = self.law_logits(logits_BxExW)
    return (jnp.broadcast_to(logits_BxV[:, None],
                             (batch, tokens_BxT.shape[1], self.vocab_size)),
            cache)

  def law_logits(self, logits_BxExW: jax.Array) -> jax.Array:
    """log psi, float32 `[B, V]` (`MASKED_LOGIT` where psi is 0), from the
    draft's logits at the root and the scored nodes `[B, E, W]`."""
    logp_BxExW = jax.nn.log_softmax(logits_BxExW.astype(jnp.float32), -1)
    batch = logp_BxExW.shape[0]
    edge_BxR = logp_BxExW[:, self.edge_parent_R, self.edge_id_R]
    # log m of each reached node: its edge plus its parent's log m, settled
    # one depth per pass.
    logm_BxR = edge_BxR
    for _ in range(self.max_depth):
      logm_BxE = jnp.where(self.scored_at_E >= 0, logm_BxR[
          :, jnp.maximum(self.scored_at_E, 0)], 0.0)
      logm_BxR = edge_BxR + logm_BxE[:, self.edge_parent_R]
    m_BxE = jnp.exp(logm_BxE)
    p_BxExW = jnp.exp(logp_BxExW)
    q_BxV = jnp.zeros((batch, self.vocab_size), jnp.float32)
    rows = jnp.arange(batch)[:, None]
    q_BxV = q_BxV.at[rows, self.cut_ws_E].add(
        m_BxE * (p_BxExW * self.leave_ws_ExW).sum(-1), mode="drop")
    q_BxV = q_BxV.at[rows, self.cut_other_E].add(
        m_BxE * (p_BxExW * self.leave_other_ExW).sum(-1), mode="drop")
    q_BxV = q_BxV.at[rows, self.cut_R].add(jnp.exp(logm_BxR), mode="drop")
    if self.eos_id >= 0:
      q_BxV = q_BxV.at[:, self.eos_id].add(p_BxExW[:, 0, self.draft_eos])
    return jnp.where(q_BxV > 0, jnp.log(jnp.maximum(q_BxV, 1e-38)),
                     MASKED_LOGIT)
