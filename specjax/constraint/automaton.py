"""A token-level automaton on the device: what the decode loop masks with.

A `Constraint` is a deterministic automaton over bytes, lifted to tokens. Its
state after a prefix of generated text says which tokens may come next; the
decode loop keeps one state per row, masks the target's and the draft's
logits alike at every position it scores (drafts, verification, trees), and
advances a row's state over the tokens it commits.

The tables, built once on the host (`from_byte_dfa`):

  masks_UxW       uint32: the allowed tokens of a state, one bit per id
                  (W = ceil(V / 32)); states with the same allowed set share
                  a row, so U <= S, and `mask_row_S` picks it. EOS ids are
                  not in these bits: they are allowed exactly at final
                  states, and only the ids the loop stops on.
  next_SxC        int16 (int32 past 32,767 states): the byte DFA, one column per byte class
                  (`byte_class_256`); a token's next state is the walk over
                  its bytes (`token_bytes_N` from `token_start_V`, for
                  `token_len_V` bytes), so the transitions cost 4 C bytes
                  per state plus the vocabulary's bytes, shared by every
                  state.
  final_S         bool: the text so far is in the language.
  stop_S          bool: final, and no token but EOS may follow (the row
                  stops there, as at EOS). Its mask row allows every token:
                  positions a round scores past such a token are never
                  committed, and an empty row would be a non-finite law.

State S - 1 is the dead state (a token the mask forbids leads there; a
decoder never commits one). The constrained law at a position is the
model's logits with forbidden ids at -inf, before the sampling transform:
p restricted to the allowed tokens and renormalised, then temperature,
top-k and top-p as without a constraint.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks

# A token longer than this many bytes is refused (a vocabulary of byte runs
# this long has no use for them, and the walk is this many steps).
MAX_TOKEN_BYTES = 256

# Negative controls of the exactness tests, wrong on purpose (see
# `Constraint.control`).
CONTROLS = ("draft_unmasked", "advance_rejected")


@flax.struct.dataclass(kw_only=True)
class Constraint:
  """A compiled constraint: device tables plus a few static numbers.

  A pytree: the decode loop takes it as a traced argument, so constraints
  with the same table shapes share one compiled program. Build one with
  `specjax.constraint.regex`, `json_schema` or `from_byte_dfa`.

  Attributes (arrays as in the module docstring):
    vocab_size: V, the tokenizer's ids; a model's head may be wider (its
      padding ids are never allowed).
    pattern: the regular expression it was compiled from (or a name).
    control: None, or one of `CONTROLS`: a deliberately WRONG decoder for
      the exactness tests to reject ("draft_unmasked": drafts drawn from
      the unmasked draft law, judged as if masked; "advance_rejected": a
      row's state advanced over every draft, kept or not).
  """
  masks_UxW: jax.Array
  mask_row_S: jax.Array
  next_SxC: jax.Array
  byte_class_256: jax.Array
  token_bytes_N: jax.Array
  token_start_V: jax.Array
  token_len_V: jax.Array
  final_S: jax.Array
  stop_S: jax.Array
  initial: jax.Array
  vocab_size: int = flax.struct.field(pytree_node=False)
  pattern: str = flax.struct.field(pytree_node=False, default="")
  control: str | None = flax.struct.field(pytree_node=False, default=None)

  @property
  def num_states(self) -> int:
    """S, the dead state included."""
    return int(self.mask_row_S.shape[0])

  def memory(self) -> dict[str, float]:
    """Bytes of the device tables: per state (masks, transitions and flags
    over S) and shared (the vocabulary's bytes)."""
    per_state = sum(int(a.nbytes) for a in (
        self.masks_UxW, self.mask_row_S, self.next_SxC, self.final_S,
        self.stop_S))
    shared = sum(int(a.nbytes) for a in (
        self.byte_class_256, self.token_bytes_N, self.token_start_V,
        self.token_len_V))
    return {"states": self.num_states, "masks": int(self.masks_UxW.shape[0]),
            "bytes_per_state": per_state / self.num_states,
            "shared_bytes": shared, "vocab_size": self.vocab_size}

  def with_control(self, control: str | None) -> "Constraint":
    """This constraint decoding with a negative control (see `CONTROLS`)."""
    if control is not None and control not in CONTROLS:
      raise ValueError(f"control must be None or one of {CONTROLS}, got "
                       f"{control!r}.")
    return self.replace(control=control)


def _pack(allowed_SxV: np.ndarray) -> np.ndarray:
  """uint32 `[S, ceil(V / 32)]` bit rows of a bool table."""
  num, vocab = allowed_SxV.shape
  width = -(-vocab // 32)
  padded = np.zeros((num, width * 32), bool)
  padded[:, :vocab] = allowed_SxV
  weights = (np.uint32(1) << np.arange(32, dtype=np.uint32))
  return (padded.reshape(num, width, 32) * weights).sum(
      axis=-1, dtype=np.uint64).astype(np.uint32)


def from_byte_dfa(next_Sx256: Any, final_S: Any, initial: int,
                  token_bytes: list[bytes | None], *,
                  allowed_SxV: Any = None, pattern: str = "") -> Constraint:
  """A `Constraint` from a byte-level DFA and a vocabulary's bytes.

  Args:
    next_Sx256: int `[S, 256]`, the next state per (state, byte), -1 where
      the byte leaves the language's prefixes. Every state must be live: a
      final state is reachable from it.
    final_S: bool `[S]`, accepting states.
    initial: the start state, in [0, S).
    token_bytes: V entries, the bytes each id stands for; None for an id
      that is no text (EOS, BOS, padding, other specials): never allowed
      but as EOS at final states, and it leaves the state unchanged.
    allowed_SxV: optional bool `[S, V]`, the allowed tokens per state a
      library computed, as a check: each token the walk allows (its bytes
      stay live; the mask is built from the walk) must be allowed there.
    pattern: a name recorded on the result.

  Returns:
    The device tables; raises ValueError if the language holds only the
    empty string, or if a state reachable at a token boundary is neither
    final nor followed by any token.
  """
  next_Sx256 = np.asarray(next_Sx256, np.int64)
  final_S = np.asarray(final_S, bool)
  if next_Sx256.ndim != 2 or next_Sx256.shape[1] != 256:
    raise ValueError(f"next_Sx256 must be [S, 256], got {next_Sx256.shape}.")
  num = next_Sx256.shape[0]
  if final_S.shape != (num,):
    raise ValueError(f"final_S must be [{num}], got {final_S.shape}.")
  initial = _checks.check_int("initial", initial, low=0, high=num - 1)
  if next_Sx256.min() < -1 or next_Sx256.max() >= num:
    raise ValueError("next_Sx256 holds a state outside [-1, S).")
  vocab = len(token_bytes)
  if vocab < 1:
    raise ValueError("token_bytes must list at least one id.")
  lengths_V = np.array([0 if b is None else len(b) for b in token_bytes])
  longest = max(1, int(lengths_V.max()))
  if longest > MAX_TOKEN_BYTES:
    raise ValueError(f"a token of {longest} bytes is longer than "
                     f"MAX_TOKEN_BYTES = {MAX_TOKEN_BYTES}.")
  starts_V = np.concatenate([[0], np.cumsum(lengths_V)[:-1]])
  flat_N = np.frombuffer(b"".join(b for b in token_bytes if b) or b"\0",
                         np.uint8).astype(np.int64)

  # The dead state D = S: every byte from it stays there.
  dead = num
  table = np.where(next_Sx256 < 0, dead, next_Sx256)
  table = np.concatenate([table, np.full((1, 256), dead)], axis=0)
  final = np.append(final_S, False)

  def walk(state, ids_X):
    """The state after each token of `ids_X` from `state` (dead if it
    dies); a token leaves the walk when it ends or dies, so a state costs
    about one step per token."""
    cur = np.full(ids_X.shape, state)
    active = np.arange(ids_X.size)
    for i in range(longest):
      active = active[lengths_V[ids_X[active]] > i]
      if not active.size:
        break
      cur[active] = table[cur[active], flat_N[starts_V[ids_X[active]] + i]]
      active = active[cur[active] != dead]
    return cur

  # The states at token boundaries (reachable from `initial` by whole
  # tokens), and each one's allowed tokens: breadth first over the walk.
  text_V = lengths_V > 0
  ids = np.flatnonzero(text_V)
  allowed = {}
  frontier, seen = [initial], {initial}
  given = None if allowed_SxV is None else np.asarray(allowed_SxV, bool)
  while frontier:
    s = frontier.pop()
    after = walk(s, ids)
    ok = after != dead
    if given is not None:
      # Every token the walk keeps must be one the library allows; it may
      # allow more (outlines-core 0.2 lets a token run past the end of a
      # match: `}',` after a JSON document's closing `}`), which the mask,
      # built from the walk, never does.
      missing = ok & ~given[s, ids]
      if missing.any():
        bad = ids[np.flatnonzero(missing)[0]]
        raise ValueError(
            f"allowed_SxV forbids token {bad} ({token_bytes[bad]!r}) at "
            f"state {s}, where the byte DFA's walk allows it.")
    allowed[s] = ids[ok]
    for t in np.unique(after[ok]):
      if int(t) not in seen:
        seen.add(int(t))
        frontier.append(int(t))
  stop = np.zeros(num + 1, bool)
  for s, kept in allowed.items():
    if kept.size == 0:
      if not final[s]:
        raise ValueError(
            f"state {s} of {pattern or 'the automaton'} is reached at a "
            "token boundary, but no token continues it and it is not "
            "final: this vocabulary cannot finish the pattern there.")
      stop[s] = True
  if stop[initial]:
    raise ValueError(f"{pattern or 'the automaton'} matches only the empty "
                     "string: there is nothing to generate.")

  # Mask rows: the allowed set, or every token where no row is ever read
  # for a decision (stop, dead, and states between token boundaries).
  allowed_SxV_full = np.ones((num + 1, vocab), bool)
  for s, kept in allowed.items():
    if not stop[s]:
      row = np.zeros(vocab, bool)
      row[kept] = True
      allowed_SxV_full[s] = row
  packed = _pack(allowed_SxV_full)
  masks_UxW, mask_row_S = np.unique(packed, axis=0, return_inverse=True)

  # Byte classes: bytes whose columns agree in every state are one class.
  classes_Cx, byte_class_256 = np.unique(table.T, axis=0, return_inverse=True)
  # Two-byte state ids where they fit: the DFA is most of a state's bytes at
  # small vocabularies.
  index = jnp.int16 if num + 1 <= np.iinfo(np.int16).max else jnp.int32
  return Constraint(
      masks_UxW=jnp.asarray(masks_UxW, jnp.uint32),
      mask_row_S=jnp.asarray(mask_row_S.reshape(-1), index),
      next_SxC=jnp.asarray(classes_Cx.T, index),
      byte_class_256=jnp.asarray(byte_class_256.reshape(-1), jnp.uint8),
      token_bytes_N=jnp.asarray(flat_N, jnp.uint8),
      token_start_V=jnp.asarray(starts_V, jnp.int32),
      token_len_V=jnp.asarray(lengths_V, jnp.int32),
      final_S=jnp.asarray(final), stop_S=jnp.asarray(stop),
      initial=jnp.asarray(initial, jnp.int32), vocab_size=vocab,
      pattern=pattern)


def allowed(constraint: Constraint, state_X: jax.Array, vocab: int,
            eos_ids: tuple[int, ...] = ()) -> jax.Array:
  """bool `[..., vocab]`: the ids allowed after states `state_X` (int32
  `[...]`): the state's mask row, and the `eos_ids` at final states. Ids
  past the constraint's vocabulary (a padded head) are never allowed."""
  words_XxW = constraint.masks_UxW[constraint.mask_row_S[state_X]]
  shifts = jnp.arange(32, dtype=jnp.uint32)
  bits_XxV = ((words_XxW[..., None] >> shifts) & 1).astype(bool).reshape(
      *state_X.shape, -1)
  own = min(vocab, constraint.vocab_size)
  bits_XxV = bits_XxV[..., :own]
  if vocab > own:
    bits_XxV = jnp.concatenate(
        [bits_XxV, jnp.zeros((*state_X.shape, vocab - own), bool)], axis=-1)
  if eos_ids:
    is_eos_V = jnp.zeros((vocab,), bool).at[jnp.asarray(eos_ids)].set(True)
    bits_XxV = bits_XxV | (constraint.final_S[state_X][..., None] & is_eos_V)
  return bits_XxV


def mask_logits(constraint: Constraint, state_X: jax.Array,
                logits_XxV: jax.Array, eos_ids: tuple[int, ...] = ()
                ) -> jax.Array:
  """`logits_XxV` with the ids `allowed` forbids at -inf (same dtype)."""
  ok_XxV = allowed(constraint, state_X, logits_XxV.shape[-1], eos_ids)
  return jnp.where(ok_XxV, logits_XxV, -jnp.inf).astype(logits_XxV.dtype)


def advance(constraint: Constraint, state_X: jax.Array,
            token_X: jax.Array) -> jax.Array:
  """int32 `[...]`: the states after `token_X` (int `[...]`): the walk of
  the byte DFA over the token's bytes. An id with no bytes (EOS, specials,
  a padded head's ids) leaves the state as it is."""
  ids = jnp.clip(token_X, 0, constraint.vocab_size - 1)
  length_X = jnp.where(token_X < constraint.vocab_size,
                       constraint.token_len_V[ids], 0)
  start_X = constraint.token_start_V[ids]

  # As many steps as the longest of these tokens (a few bytes, typically),
  # not the vocabulary's longest.
  def step(carry):
    i, cur_X = carry
    byte_X = constraint.token_bytes_N[start_X + i].astype(jnp.int32)
    nxt = constraint.next_SxC[cur_X, constraint.byte_class_256[byte_X]].astype(
        jnp.int32)
    return i + 1, jnp.where(i < length_X, nxt, cur_X)

  return jax.lax.while_loop(lambda c: c[0] < jnp.max(length_X), step,
                            (jnp.int32(0), state_X.astype(jnp.int32)))[1]


def advance_path(constraint: Constraint, state_B: jax.Array,
                 tokens_BxT: jax.Array) -> jax.Array:
  """int32 `[B, T + 1]`: the states before each of the T tokens and after
  the last (column 0 is `state_B`)."""
  def step(cur_B, token_B):
    nxt_B = advance(constraint, cur_B, token_B)
    return nxt_B, nxt_B
  _, after_TxB = jax.lax.scan(step, state_B, tokens_BxT.T)
  return jnp.concatenate([state_B[:, None], after_TxB.T], axis=1)


def accepts(constraint: Constraint, ids: Any) -> bool:
  """Whether the text of token ids `ids` (int `[N]`, e.g. one row of a
  generation up to its length) is in the language: the walk from the
  initial state ends in a final state (EOS and other ids without text
  leave it where it is)."""
  ids_N = np.asarray(ids, np.int64).reshape(-1)
  state = constraint.initial
  if ids_N.size:
    state = advance_path(constraint, jnp.asarray(state)[None],
                         jnp.asarray(ids_N, jnp.int32)[None])[0, -1]
  return bool(constraint.final_S[state])


def check(constraint: Any, vocab_size: int, name: str = "constraint"
          ) -> Constraint | None:
  """The entry points' check: None, or a `Constraint` whose vocabulary
  fits a head of `vocab_size` ids."""
  if constraint is None:
    return None
  if isinstance(constraint, (str, dict)):
    raise TypeError(
        f"{name} must be a compiled Constraint, which needs the tokenizer: "
        "specjax.constraint.regex(pattern, tokenizer) or "
        "specjax.constraint.json_schema(schema, tokenizer); got a "
        f"{type(constraint).__name__}.")
  if not isinstance(constraint, Constraint):
    raise TypeError(f"{name} must be a specjax.constraint.Constraint, got "
                    f"{type(constraint).__name__}.")
  if constraint.vocab_size > vocab_size:
    raise ValueError(
        f"{name} was compiled for {constraint.vocab_size} token ids, more "
        f"than the model's vocab_size {vocab_size}: compile it with the "
        "model's own tokenizer.")
  return constraint


__all__ = ["Constraint", "CONTROLS", "from_byte_dfa", "allowed",
           "mask_logits", "advance", "advance_path", "accepts", "check"]
