"""Text corpora that need no download, split by a stable hash of each path.

The built-in corpus is the Python standard library source of the running
interpreter: every `*.py` file under `sysconfig.get_paths()["stdlib"]`,
excluding `site-packages/` and `dist-packages/` (third-party code that varies
from machine to machine). The stdlib's own test suites (`test/`, `tests/`,
`idle_test/`) are included by default: they are half the bytes and ordinary
Python code; pass `include_tests=False` to drop them.

`text_corpus` reads the user's own files instead (files, directories, globs).

Split. A file is held out when the first 64 bits of sha256(relative path),
read as a fraction of 2**64, fall below `heldout_fraction`. The split of a
file therefore depends only on its path, not on which other files exist, the
machine, or Python's hash seed; adding files never moves existing ones.

Tokens. Each split is one token array (the byte tokenizer's ids, see
`specjax.data.tokenizer`): every file becomes `BOS bytes... EOS`, files in
sorted relative-path order, concatenated. It is stored as uint16 (the ids are
< 2**16) to halve memory; `batches` and `prompts` return int32.
`corpus.tokenized(tokenizer)` is the same text in another tokenizer's ids
(e.g. a BPE of `specjax.data.bpe`): every file becomes `[BOS] ids... EOS`
(BOS where the tokenizer has one), the file read as UTF-8 (errors
replaced) and encoded without its post-processor.

Fingerprint. `Corpus.fingerprint()` is a JSON-ready dict (interpreter
version, file count, bytes, sha256 over paths and contents, split sizes) that
every results and checkpoint metadata file records, so a number can always be
traced to the exact text it came from.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import glob
import hashlib
import os
import platform
import sysconfig
from typing import Any, Iterable, Sequence

import numpy as np

from specjax import _checks
from specjax.data import hf_tokenizer
from specjax.data import tokenizer as tokenizer_lib

SPLITS = ("train", "heldout")
DEFAULT_HELDOUT_FRACTION = 0.05
_THIRD_PARTY_DIRS = frozenset({"site-packages", "dist-packages"})
_TEST_DIRS = frozenset({"test", "tests", "idle_test"})


@dataclasses.dataclass(frozen=True)
class CorpusFile:
  """One document: `rel_path` (posix, the split key) and where to read it."""
  rel_path: str
  path: str


def split_of(rel_path: str, heldout_fraction: float) -> str:
  """"train" or "heldout" for a relative path; a pure function of its inputs."""
  digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
  u = int.from_bytes(digest[:8], "big") / 2.0**64
  return "heldout" if u < heldout_fraction else "train"


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A set of documents with a stable train / held-out split.

  Attributes:
    source: "stdlib" or "text".
    root: the directory the stdlib was read from, or None for user files.
    files: the documents, sorted by `rel_path` (unique).
    heldout_fraction: the expected fraction of files held out, in [0, 1).
    tokenizer: None for the byte tokenizer's ids, else the `HFTokenizer`
      whose ids `tokens()` returns (build with `tokenized`).

  Reading is lazy: the first `tokens()` or `fingerprint()` call reads every
  file once and caches both splits and the fingerprint in memory.
  """

  source: str
  root: str | None
  files: tuple[CorpusFile, ...]
  heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
  tokenizer: Any = None
  _cache: dict = dataclasses.field(default_factory=dict, repr=False,
                                   compare=False, hash=False)

  def __post_init__(self):
    if not self.files:
      raise ValueError(f"The {self.source} corpus has no files; pass at least "
                       "one readable text file.")
    fraction = _checks.check_float("heldout_fraction", self.heldout_fraction)
    if not 0.0 <= fraction < 1.0:
      raise ValueError("heldout_fraction must be in [0, 1), got "
                       f"{fraction}; 0.05 holds out about 5% of the files.")
    object.__setattr__(self, "heldout_fraction", fraction)
    if self.tokenizer is not None:
      _check_tokenizer(self.tokenizer)
    rel_paths = [f.rel_path for f in self.files]
    if rel_paths != sorted(set(rel_paths)):
      raise ValueError("Corpus.files must be sorted by rel_path without "
                       "duplicates; build corpora with stdlib_corpus() or "
                       "text_corpus().")

  def tokenized(self, tokenizer: Any) -> "Corpus":
    """This corpus's text in `tokenizer`'s ids (an `HFTokenizer` with an
    EOS and fewer than 2**16 ids, e.g. `bpe.train_bpe(corpus, 1024)`'s).
    Its fingerprint names the tokenizer and its content fingerprint."""
    _check_tokenizer(tokenizer)
    return dataclasses.replace(self, tokenizer=tokenizer, _cache={})

  def split_files(self, split: str) -> tuple[CorpusFile, ...]:
    """The files of `split` ("train" or "heldout"), in corpus order."""
    _check_split(split)
    return tuple(f for f in self.files
                 if split_of(f.rel_path, self.heldout_fraction) == split)

  def tokens(self, split: str) -> np.ndarray:
    """The uint16 token array `[N]` of `split`: `BOS doc EOS BOS doc EOS ...`.

    Raises if the split has no files (a tiny corpus with a small
    `heldout_fraction` may hold none out). Cached; do not modify in place.
    """
    _check_split(split)
    self._load()
    if split not in self._cache["tokens"]:
      self._cache["tokens"][split] = _frame_ids(
          self.tokenizer, self._cache["chunks"].pop(split))
    tokens_N = self._cache["tokens"][split]
    if tokens_N.size == 0:
      raise ValueError(
          f"The {split} split of the {self.source} corpus is empty (0 of "
          f"{len(self.files)} files, heldout_fraction={self.heldout_fraction})."
          " Add more files or change heldout_fraction.")
    return tokens_N

  def fingerprint(self) -> dict:
    """A JSON-ready dict identifying the exact text of this corpus.

    Keys: source, root, interpreter, files, bytes, sha256 (over every file's
    relative path, length and content, in corpus order), heldout_fraction,
    train_files, train_bytes, heldout_files, heldout_bytes, tokenizer.
    """
    self._load()
    return dict(self._cache["fingerprint"])

  def _load(self) -> None:
    if "tokens" in self._cache:
      return
    hasher = hashlib.sha256()
    chunks = {split: [] for split in SPLITS}
    for f in self.files:
      data = _read(f.path)
      # Length-prefixing makes the hash unambiguous (no two different corpora
      # serialise to the same byte stream).
      name = f.rel_path.encode("utf-8")
      hasher.update(len(name).to_bytes(8, "little") + name)
      hasher.update(len(data).to_bytes(8, "little") + data)
      chunks[split_of(f.rel_path, self.heldout_fraction)].append(data)
    if self.tokenizer is None:
      tokens = {split: _frame(chunks[split]) for split in SPLITS}
    else:
      # Encoded on the first `tokens(split)`: a fingerprint (what a recipe
      # key reads) then costs no encoding of the whole text.
      tokens = {}
      self._cache["chunks"] = chunks
    nbytes = {split: sum(map(len, chunks[split])) for split in SPLITS}
    self._cache["fingerprint"] = {
        "source": self.source,
        "root": self.root,
        "interpreter": (f"{platform.python_implementation()} "
                        f"{platform.python_version()}"),
        "files": len(self.files),
        "bytes": nbytes["train"] + nbytes["heldout"],
        "sha256": hasher.hexdigest(),
        "heldout_fraction": self.heldout_fraction,
        "train_files": len(chunks["train"]),
        "train_bytes": nbytes["train"],
        "heldout_files": len(chunks["heldout"]),
        "heldout_bytes": nbytes["heldout"],
        "tokenizer": _tokenizer_id(self.tokenizer),
    }
    self._cache["tokens"] = tokens


def _check_tokenizer(tokenizer: Any) -> None:
  if not isinstance(tokenizer, hf_tokenizer.HFTokenizer):
    raise TypeError("tokenizer must be an HFTokenizer (e.g. specjax.data.bpe."
                    "train_bpe's; None is the byte tokenizer), got "
                    f"{type(tokenizer).__name__}.")
  if tokenizer.eos_id is None:
    raise ValueError(f"tokenizer {tokenizer.name!r} has no EOS id; every "
                     "corpus file ends with one.")
  if tokenizer.vocab_size > 2**16:
    raise ValueError(f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size}"
                     " ids; corpus tokens are stored as uint16 (at most "
                     f"{2**16} ids).")


def _tokenizer_id(tokenizer: Any) -> str:
  """The fingerprint's tokenizer field: "byte259" for the byte tokenizer
  (as ever), "<name>:<16 hex digits of its content fingerprint>" else."""
  if tokenizer is None:
    return tokenizer_lib.ByteTokenizer().name
  return f"{tokenizer.name}:{tokenizer.fingerprint()[:16]}"


def _frame_ids(tokenizer: Any, docs: Sequence[bytes]) -> np.ndarray:
  """`[BOS] ids(d0) EOS [BOS] ids(d1) EOS ...` as uint16 in `tokenizer`'s
  ids (the library encodes the files in parallel)."""
  texts = [d.decode("utf-8", errors="replace") for d in docs]
  encoded = tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False)
  head = np.array([] if tokenizer.bos_id is None else [tokenizer.bos_id],
                  np.int64)
  tail = np.array([tokenizer.eos_id], np.int64)
  parts = []
  for e in encoded:
    parts += [head, np.asarray(e.ids, np.int64), tail]
  if not parts:
    return np.empty(0, np.uint16)
  return np.concatenate(parts).astype(np.uint16)


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")


def _read(path: str) -> bytes:
  try:
    with open(path, "rb") as fh:
      return fh.read()
  except OSError as e:
    raise OSError(f"Cannot read corpus file {path!r}: {e.strerror or e}. "
                  "Fix its permissions, or leave it out of the corpus "
                  "paths.") from e


def _frame(docs: Sequence[bytes]) -> np.ndarray:
  """`BOS d0 EOS BOS d1 EOS ...` as uint16, built without Python-level loops
  over bytes (the stdlib is ~30 MB)."""
  total = sum(len(d) + 2 for d in docs)
  out_N = np.empty(total, np.uint16)
  pos = 0
  for d in docs:
    out_N[pos] = tokenizer_lib.BOS_ID
    out_N[pos + 1:pos + 1 + len(d)] = np.frombuffer(d, np.uint8)
    out_N[pos + 1 + len(d)] = tokenizer_lib.EOS_ID
    pos += len(d) + 2
  return out_N


# The first word of `text_prompts`' seed: a stream of its own.
_TEXT_PROMPT_STREAM = 2


def text_prompts(corpus: Corpus, n: int, prompt_bytes: int, seed: int = 0,
                 split: str = "heldout") -> list[str]:
  """`n` prompts as text: windows of `prompt_bytes` bytes of `split`, each
  inside one file and whole UTF-8, so that targets of different tokenizers
  can encode the same text (`encode_batch`). A pure function of the
  arguments (the text, not the corpus's tokenizer, is read)."""
  if not isinstance(corpus, Corpus):
    raise TypeError(f"corpus must be a Corpus, got {type(corpus).__name__}.")
  n = _checks.check_int("n", n, low=1)
  prompt_bytes = _checks.check_int("prompt_bytes", prompt_bytes, low=1)
  seed = _checks.check_int("seed", seed, low=0)
  if corpus.tokenizer is not None:
    corpus = dataclasses.replace(corpus, tokenizer=None, _cache={})
  tokens_N = corpus.tokens(split)
  if tokens_N.size < prompt_bytes:
    raise ValueError(f"the {split} split holds {tokens_N.size} tokens, fewer "
                     f"than prompt_bytes={prompt_bytes}.")
  rng = np.random.default_rng([_TEXT_PROMPT_STREAM, seed])
  out: list[str] = []
  for _ in range(100 * n + 1000):  # most windows qualify
    start = int(rng.integers(0, tokens_N.size - prompt_bytes + 1))
    window = tokens_N[start:start + prompt_bytes]
    if (window > 255).any():  # a file boundary (BOS / EOS) inside
      continue
    try:
      out.append(window.astype(np.uint8).tobytes().decode("utf-8"))
    except UnicodeDecodeError:  # cut inside a character
      continue
    if len(out) == n:
      return out
  raise ValueError(f"found {len(out)} of {n} windows of {prompt_bytes} bytes "
                   f"inside one file of the {split} split; use shorter "
                   "prompts.")


def stdlib_dir() -> str:
  """The running interpreter's standard library directory."""
  return sysconfig.get_paths()["stdlib"]


def stdlib_corpus(*, max_bytes: int | None = None, include_tests: bool = True,
                  heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
                  root: str | None = None) -> Corpus:
  """The `*.py` files of the interpreter's standard library (about 30 MB).

  Args:
    max_bytes: if given, keep a subset of at most this many bytes (by file
      size on disk) for quick runs. The subset is chosen in the order of the
      files' path hashes, so it is stable and spread over the whole library
      rather than the alphabetically first package.
    include_tests: keep the stdlib's test suites (`test/`, `tests/`,
      `idle_test/` directories).
    heldout_fraction: expected fraction of files held out, in [0, 1).
    root: read this directory instead of the interpreter's stdlib (for tests).

  Returns:
    A lazily read `Corpus` with `source="stdlib"`.
  """
  root = os.path.abspath(root if root is not None else stdlib_dir())
  if not os.path.isdir(root):
    raise FileNotFoundError(f"The standard library directory {root!r} does not "
                            "exist; pass your own files with text_corpus().")
  if max_bytes is not None:
    max_bytes = _checks.check_int("max_bytes", max_bytes, low=1)
  include_tests = _checks.check_bool("include_tests", include_tests)
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    # Pruning in place stops os.walk from descending; symlinked directories
    # are not followed (os.walk default), so there are no cycles.
    dirnames[:] = sorted(
        d for d in dirnames
        if d not in _THIRD_PARTY_DIRS and d != "__pycache__"
        and (include_tests or d not in _TEST_DIRS))
    for name in filenames:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        if os.path.isfile(path):
          found.append(CorpusFile(_rel(path, root), path))
  if max_bytes is not None:
    # A salted hash: ordering by the split hash itself would put the held-out
    # files (smallest hashes) first and starve the training split.
    found.sort(key=lambda f: hashlib.sha256(
        b"subset:" + f.rel_path.encode()).digest())
    kept, used = [], 0
    for f in found:
      size = os.path.getsize(f.path)
      if used + size <= max_bytes:
        kept.append(f)
        used += size
    found = kept
  if not found:
    raise ValueError(f"No *.py files found under {root!r}"
                     + (f" within max_bytes={max_bytes}" if max_bytes else "")
                     + ". Raise max_bytes or pass your own files with "
                     "text_corpus().")
  return Corpus("stdlib", root, tuple(sorted(found, key=lambda f: f.rel_path)),
                heldout_fraction)


def text_corpus(paths: str | Iterable[str], *,
                heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
                suffixes: Sequence[str] | None = None) -> Corpus:
  """A corpus of the user's own text files.

  Args:
    paths: files, directories (read recursively, skipping hidden entries) or
      glob patterns (`**` allowed). A comma-separated string is split, so a
      command-line flag value can be passed as is.
    heldout_fraction: expected fraction of files held out, in [0, 1).
    suffixes: if given, keep only files whose name ends with one of these
      (e.g. `(".txt", ".md")`); applies to directories and globs.

  The split key of each file is its path relative to the directory named
  (for a directory), to the fixed prefix of the pattern (for a glob), or its
  base name (for a file), so moving the whole corpus keeps the split.

  Raises:
    ValueError: when nothing matches (naming the pattern), or when two files
      share a relative path (pass their common parent directory instead).
    FileNotFoundError: when a plain path does not exist.
  """
  if isinstance(paths, (str, os.PathLike)):
    paths = [p.strip() for p in os.fspath(paths).split(",") if p.strip()]
  elif isinstance(paths, collections.abc.Iterable):
    paths = list(paths)
  else:
    raise TypeError(f"paths must be a path, a comma-separated string or a "
                    f"sequence of them, got {paths!r}.")
  if not paths:
    raise ValueError("paths is empty; pass files, directories or glob "
                     "patterns of your text corpus.")
  if isinstance(suffixes, str):
    suffixes = (suffixes,)  # tuple(".txt") would be ('.', 't', 'x', 't')
  if suffixes is not None:
    suffixes = tuple(suffixes)
    if not all(isinstance(s, str) and s for s in suffixes):
      raise TypeError(f"suffixes must be non-empty strings, got {suffixes}.")
  by_rel: dict[str, CorpusFile] = {}
  for spec in paths:
    if not isinstance(spec, (str, os.PathLike)):
      raise TypeError(f"paths must hold strings, got {spec!r}.")
    spec = os.path.expanduser(os.fspath(spec))
    matches = list(_expand(spec, suffixes))
    if not matches:
      raise ValueError(f"paths entry {spec!r} matches no files"
                       + (f" with suffixes {suffixes}" if suffixes else "")
                       + ". Check the path or pattern.")
    for f in matches:
      other = by_rel.get(f.rel_path)
      if other is not None and os.path.realpath(other.path) != os.path.realpath(
          f.path):
        raise ValueError(
            f"Two corpus files share the relative path {f.rel_path!r}: "
            f"{other.path!r} and {f.path!r}. Pass their common parent "
            "directory instead, so the relative paths (the split keys) differ.")
      by_rel[f.rel_path] = f
  files = tuple(by_rel[k] for k in sorted(by_rel))
  return Corpus("text", None, files, heldout_fraction)


def from_flag(value: str, *, heldout_fraction: float =
              DEFAULT_HELDOUT_FRACTION, max_bytes: int | None = None) -> Corpus:
  """The corpus a `--corpus` flag names: "stdlib" or comma-separated paths."""
  if not isinstance(value, str) or not value.strip():
    raise ValueError("The corpus flag must be 'stdlib' or comma-separated "
                     f"files/directories/globs, got {value!r}.")
  if value.strip() == "stdlib":
    return stdlib_corpus(max_bytes=max_bytes,
                         heldout_fraction=heldout_fraction)
  if max_bytes is not None:
    raise ValueError("max_bytes only applies to the stdlib corpus; select "
                     "fewer files instead.")
  return text_corpus(value, heldout_fraction=heldout_fraction)


def _rel(path: str, base: str) -> str:
  return os.path.relpath(path, base).replace(os.sep, "/")


def _expand(spec: str, suffixes: tuple[str, ...] | None):
  """Yields the CorpusFiles one `paths` entry names."""

  def keep(name):
    return suffixes is None or name.endswith(suffixes)

  if glob.has_magic(spec):
    # The fixed prefix of the pattern is the base of the relative paths.
    parts = spec.replace(os.sep, "/").split("/")
    fixed = []
    for part in parts:
      if glob.has_magic(part):
        break
      fixed.append(part)
    base = os.path.abspath("/".join(fixed) or ".")
    for path in sorted(glob.glob(spec, recursive=True)):
      if os.path.isfile(path) and keep(os.path.basename(path)):
        yield CorpusFile(_rel(os.path.abspath(path), base), path)
  elif os.path.isdir(spec):
    base = os.path.abspath(spec)
    for dirpath, dirnames, filenames in os.walk(base):
      dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
      for name in sorted(filenames):
        path = os.path.join(dirpath, name)
        if not name.startswith(".") and keep(name) and os.path.isfile(path):
          yield CorpusFile(_rel(path, base), path)
  elif os.path.exists(spec):
    yield CorpusFile(os.path.basename(spec), spec)
  else:
    raise FileNotFoundError(f"paths entry {spec!r} does not exist. Check the "
                            "path (relative paths are read from "
                            f"{os.getcwd()!r}).")
