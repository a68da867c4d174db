"""PowerSGD: send two thin matrices instead of each gradient matrix.

A layer's gradient matrix M (a x b) is usually close to low rank. PowerSGD (Vogels et al., 2019)
approximates the *averaged* M by P Qᵀ, P (a x r) and Q (b x r), from one step of power iteration,
and sends only P and Q: (a + b)·r numbers instead of a·b. **Error feedback** (what compression lost
is added to the next gradient) and a **warm start** (last step's Q) make it train well.
:func:`powerSGD_hook` follows the steps of torch's own hook, one function each, and matches it bit
for bit; it runs every collective from the hook call, never from a Future's callback.

The algorithm, where it differs from torch's, the hooks by name: ``docs/hooks.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp import AsyncBucketDDP
    >>> model = AsyncBucketDDP(torch.nn.Linear(16, 16))
    >>> model.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2),
    ...                          powerSGD_hook)
    >>> for step in range(3):                        # step 0 and 1 plain averaging, then rank-2 factors
    ...     model(torch.ones(4, 16)).sum().backward(); model.finish_gradient_synchronization()
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from minddp.comm.default_hooks import allreduce_hook, check_real_floating
from minddp.comm.grad_bucket import GradBucket
from minddp.comm.wire import Wire
from minddp.runtime import keep

__all__ = ["PowerSGDState", "powerSGD_hook", "batched_powerSGD_hook"]

logger = logging.getLogger(__name__)


# -- linear algebra helpers ---------------------------------------------------------------------


def _orthogonalize(matrices: torch.Tensor, epsilon: float = 0.0) -> None:
    """Make the columns of each matrix in a batch (b x n x r) orthonormal, in place.

    Gram-Schmidt for rank <= 2 and for 16-bit floats (QR has no half kernels
    and is not faster for so few columns), QR otherwise: as torch decides.
    """
    rank = matrices.shape[2]
    if rank <= 2 or matrices.dtype in (torch.float16, torch.bfloat16):
        _orthogonalize_gram_schmidt(matrices, epsilon)
    else:
        matrices.copy_(torch.linalg.qr(matrices).Q)


def _orthogonalize_gram_schmidt(matrices: torch.Tensor, epsilon: float = 0.0) -> None:
    """Classical Gram-Schmidt on the columns of a batch of matrices, in place."""
    num_cols = matrices.shape[2]
    for i in range(num_cols):
        col = matrices[:, :, i : i + 1]
        norm = torch.norm(col, dim=1, keepdim=True)
        if epsilon == 0:
            # An all-zero column (a vanished gradient) would become 0/0 = NaN and
            # poison the whole step; leave it zero instead. Other columns are
            # divided by exactly their norm, as in torch.
            col /= torch.where(norm > 0, norm, torch.ones_like(norm))
        else:
            col /= norm + epsilon
        if i + 1 < num_cols:  # remove this direction from the later columns
            rest = matrices[:, :, i + 1 :]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col


def _should_compress(num_rows: int, num_cols: int, rank: int, min_compression_rate: float):
    """``(worth it?, numel before, numel after)`` for an a x b matrix at rank r.

    Worth it when a·b > min_compression_rate · (a + b)·r: compression costs
    two matmuls and an orthogonalization, so it must save enough bytes.
    """
    uncompressed, compressed = num_rows * num_cols, (num_rows + num_cols) * rank
    return compressed * min_compression_rate < uncompressed, uncompressed, compressed


@contextlib.contextmanager
def _shared_seed(state: "PowerSGDState"):
    """Seed torch's CPU RNG identically on every rank, differently at every call.

    The seed comes from the state's own numpy RNG (the same sequence on every
    rank, since every rank makes the same calls); the torch RNG is forked, so
    the user's global random stream is not disturbed. Values are drawn on the
    CPU and moved, as forking every GPU's RNG is slow.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(state.rng.randint(1_000_000_000))
        yield


# -- the state ----------------------------------------------------------------------------------


def check_start_iter(start_powerSGD_iter: int, use_error_feedback: bool, warm_start: bool) -> None:
    """PowerSGD's start rule (torch's): with error feedback or warm start, plain allreduce for 2+ steps first.

    A DDP wrapper may rebuild its buckets after step 1, which would invalidate
    memory kept per bucket (the error, P and Q).
    """
    if (use_error_feedback or warm_start) and start_powerSGD_iter < 2:
        raise ValueError(
            f"start_powerSGD_iter must be >= 2 when use_error_feedback or warm_start is on, got "
            f"{start_powerSGD_iter}: buckets may be rebuilt after step 1, which would invalidate the "
            "memorised error and P/Q; use start_powerSGD_iter=2 or more, or turn both off"
        )


class PowerSGDState:
    """Hyperparameters of PowerSGD and its memory across steps, for all buckets.

    Hyperparameters (the first two are the ones to tune):

    * ``matrix_approximation_rank`` (r): width of P and Q. Lower = stronger
      compression. Start at 1, double until accuracy is good (1-4 is typical).
    * ``start_powerSGD_iter``: plain allreduce for this many steps first; early
      training is sensitive to inexact gradients. Must be >= 2 with error
      feedback or warm start, because a DDP wrapper may rebuild its buckets
      after the first step, and memory keyed by bucket would no longer fit.
    * ``min_compression_rate``: compress a matrix only if it shrinks more than this.
    * ``use_error_feedback``, ``warm_start``: keep them on (see the module doc).
    * ``orthogonalization_epsilon``: added to column norms; a small value like
      1e-8 guards against all-zero columns (0 = exact, as torch's default).
    * ``random_seed``: seed of the RNG that draws the initial Q's.
    * ``compression_stats_logging_frequency``: log the compression rate every
      this many steps once compression started.
    * ``batch_tensors_with_same_shape``: compress same-shaped matrices with one
      batched matmul (faster when compute bound; same result).

    State kept per bucket index: ``error_dict`` (this rank's compression error
    to feed back), ``p_memory_dict`` / ``q_memory_dict`` (flat P's and Q's for
    warm start), and ``iter`` (steps seen, counted on the last bucket).

    Pickling drops the process group (it cannot be serialised) and loading sets
    it to ``None``, the default group. The error memory is *this rank's*, so
    each rank saves and loads its own state.

    Example::

        >>> import io
        >>> state, file = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2), io.BytesIO()
        >>> torch.save({"comm_hook_state": state}, file)          # each rank its own file
        >>> _ = file.seek(0); torch.load(file, weights_only=False)["comm_hook_state"]
        PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2, iter=0, use_error_feedback=True, ...)
    """

    __slots__ = [
        "process_group",
        "matrix_approximation_rank",
        "start_powerSGD_iter",
        "min_compression_rate",
        "orthogonalization_epsilon",
        "use_error_feedback",
        "warm_start",
        "batch_tensors_with_same_shape",
        "rng",
        "error_dict",
        "p_memory_dict",
        "q_memory_dict",
        "iter",
        "total_numel_before_compression",
        "total_numel_after_compression",
        "compression_stats_logging_frequency",
        "next_stats_report",
    ]

    def __init__(
        self,
        process_group: dist.ProcessGroup | None,
        matrix_approximation_rank: int = 1,
        start_powerSGD_iter: int = 1_000,
        min_compression_rate: float = 2,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 0,
        random_seed: int = 0,
        compression_stats_logging_frequency: int = 10_000,
        batch_tensors_with_same_shape: bool = False,
    ):
        if (
            isinstance(matrix_approximation_rank, bool)
            or not isinstance(matrix_approximation_rank, int)
            or matrix_approximation_rank < 1
        ):
            raise ValueError(
                f"matrix_approximation_rank must be an integer >= 1, got {matrix_approximation_rank!r}; "
                "rank 1 is the strongest compression (try 1, 2, 4, ...)"
            )
        check_start_iter(start_powerSGD_iter, use_error_feedback, warm_start)
        if min_compression_rate <= 0:
            raise ValueError(f"min_compression_rate must be > 0, got {min_compression_rate!r}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        # Same seed on every rank, so every rank draws the same random Q's;
        # a fresh seed per draw, so each step projects onto a new subspace.
        self.rng = np.random.RandomState(random_seed)
        self.error_dict: dict[int, torch.Tensor] = {}
        self.p_memory_dict: dict[int, torch.Tensor] = {}
        self.q_memory_dict: dict[int, torch.Tensor] = {}
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.next_stats_report = 0

    def __getstate__(self) -> dict:
        """Everything but the process group, which cannot be pickled."""
        return {slot: getattr(self, slot) for slot in self.__slots__ if slot != "process_group"}

    def __setstate__(self, state: dict) -> None:
        """Restore the fields; the group becomes ``None`` (the default group; set another after loading)."""
        self.process_group = None
        for slot, value in state.items():
            setattr(self, slot, value)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count a step when its last bucket has been handled."""
        if bucket.is_last():
            self.iter += 1
            if self.iter == self.start_powerSGD_iter:
                logger.info("PowerSGD compression starts after %s iterations", self.iter)

    def compression_stats(self) -> tuple[float, int, int]:
        """``(rate, numel before, numel after)`` over every compressed step so far (rate 0 if none)."""
        after = self.total_numel_after_compression
        rate = self.total_numel_before_compression / after if after > 0 else 0
        return rate, self.total_numel_before_compression, after

    def _report_compression_stats(self, bucket: GradBucket) -> None:
        if bucket.is_last() and self.iter >= self.next_stats_report:
            rate, before, after = self.compression_stats()
            logger.info(
                "PowerSGD iter %s: %s numbers before compression, %s after, rate %.1f", self.iter, before, after, rate
            )
            self.next_stats_report = self.iter + self.compression_stats_logging_frequency

    def __repr__(self) -> str:
        return (
            f"PowerSGDState(matrix_approximation_rank={self.matrix_approximation_rank}, "
            f"start_powerSGD_iter={self.start_powerSGD_iter}, iter={self.iter}, "
            f"use_error_feedback={self.use_error_feedback}, warm_start={self.warm_start})"
        )


def _vanilla_phase(state: PowerSGDState, bucket: GradBucket) -> torch.futures.Future | None:
    """Plain averaging before ``start_powerSGD_iter`` (None once compression has started)."""
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(state.process_group, bucket)
    return None


def _add_error_feedback(state: PowerSGDState, index: int, tensor: torch.Tensor) -> torch.Tensor | None:
    """Add last step's local error into ``tensor``; return a copy of the result (None if off)."""
    if not state.use_error_feedback:
        return None
    if index in state.error_dict:
        tensor.add_(state.error_dict[index])
    else:
        state.error_dict[index] = torch.zeros_like(tensor)
    return tensor.detach().clone()


# -- the layer-wise hook ------------------------------------------------------------------------


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> torch.futures.Future:
    """Average the bucket with each big enough gradient matrix sent as rank-r factors.

    Before ``state.start_powerSGD_iter`` steps this is :func:`allreduce_hook`.
    After:

    1. add the error feedback to the bucket and keep a copy of the result;
    2. view every gradient as a matrix (a, everything else) and split them:
       matrices that compress well enough (``min_compression_rate``), and the
       rest (biases, small layers), which are averaged uncompressed;
    3. take Q (b x r) from last step (warm start) or draw it at random, and
       orthogonalize it; compute P = M Q for every compressed matrix;
    4. all_reduce the uncompressed tensors and all P's (sums), waiting for
       the P's here (:func:`_compute_qs` says why);
    5. orthogonalize each P; compute Q = Mᵀ P; all_reduce the Q's and divide
       them by the world size;
    6. when the Q's arrive: M ≈ P Qᵀ written over each matrix, the averaged
       uncompressed tensors copied back, the new local error
       (step 1's copy − the result) memorised, and the bucket returned.

    Example::

        >>> from minddp import DistributedDataParallel
        >>> ddp = DistributedDataParallel(torch.nn.Linear(16, 16))
        >>> ddp.register_comm_hook(PowerSGDState(None, start_powerSGD_iter=10), powerSGD_hook)
    """
    check_real_floating(bucket, "powerSGD_hook")  # from the first step, not only once compression starts
    vanilla = _vanilla_phase(state, bucket)
    if vanilla is not None:
        return vanilla
    wire = Wire.of(state.process_group)
    world_size = wire.size()
    input_tensor, index = bucket.buffer(), bucket.index()
    input_copy = _add_error_feedback(state, index, input_tensor)  # step 1
    to_compress, uncompressed, p_size, q_size = _split_by_compression(state, bucket)  # step 2
    by_shape, batches = _batch_by_shape(state, to_compress)
    ps, qs = _compute_ps(state, index, batches, p_size, q_size, input_tensor)  # step 3
    last = None  # step 4
    if uncompressed:
        uncompressed_flat = torch.cat([t.reshape(-1) for t in uncompressed])
        last = wire.all_reduce(uncompressed_flat)
    if batches:
        last = _compute_qs(state, wire, index, batches, ps, qs, before=last)  # steps 4-5

    def decompress(_: torch.futures.Future) -> torch.Tensor:  # step 6
        if uncompressed:
            _unpack_uncompressed(uncompressed, uncompressed_flat.div_(world_size))
        if batches:
            state.q_memory_dict[index].div_(world_size)
            _approximate(state, by_shape, batches, ps, qs)
        if input_copy is not None:
            state.error_dict[index] = input_copy - input_tensor
        if not state.warm_start:
            state.p_memory_dict.pop(index, None)
            state.q_memory_dict.pop(index, None)
        state.maybe_increase_iter(bucket)
        return input_tensor

    # One chain of Futures, never ``collect_all``: its Future holds no device, so on a GPU the callback
    # would neither wait for the sums' copies nor hand its own writes on to the caller's stream.
    return keep.then(last, decompress)


def _split_by_compression(state: PowerSGDState, bucket: GradBucket):
    """Step 2 (torch's step I): each gradient as a matrix (a, everything else); those worth compressing,
    the rest; and the sizes of all P's (a x r) and Q's (b x r) together."""
    to_compress, uncompressed = [], []
    p_size = q_size = 0
    for tensor in bucket.gradients():
        matrix = tensor.view(tensor.shape[0], -1) if tensor.dim() > 0 else tensor.view(1, 1)
        n, m = matrix.shape
        rank = min(n, m, state.matrix_approximation_rank)
        worth_it, before, after = _should_compress(n, m, rank, state.min_compression_rate)
        state.total_numel_before_compression += before
        if worth_it:
            to_compress.append(matrix)
            p_size, q_size = p_size + n * rank, q_size + m * rank
            state.total_numel_after_compression += after
        else:
            uncompressed.append(tensor)
            state.total_numel_after_compression += before
    state._report_compression_stats(bucket)
    return to_compress, uncompressed, p_size, q_size


def _batch_by_shape(state: PowerSGDState, to_compress: list[torch.Tensor]):
    """Same-shaped matrices go through one batched matmul (b x n x m) if the state asks for it."""
    by_shape: dict[torch.Size, list[torch.Tensor]] = defaultdict(list)
    for matrix in to_compress:
        by_shape[matrix.shape].append(matrix)
    if state.batch_tensors_with_same_shape:
        batches = [group_[0].unsqueeze(0) if len(group_) == 1 else torch.stack(group_) for group_ in by_shape.values()]
    else:
        batches = [matrix.unsqueeze(0) for group_ in by_shape.values() for matrix in group_]
    return by_shape, batches


def _compute_ps(state: PowerSGDState, index: int, batches, p_size: int, q_size: int, like: torch.Tensor):
    """Step 3 (torch's step III): Q from last step (warm start) or drawn at random, orthogonalized; P = M Q."""
    need_random_q = not state.warm_start or index not in state.p_memory_dict
    if need_random_q:
        state.p_memory_dict[index] = torch.empty(p_size, device=like.device, dtype=like.dtype)
        state.q_memory_dict[index] = torch.empty(q_size, device=like.device, dtype=like.dtype)
    ps, qs = _carve(state.p_memory_dict[index], state.q_memory_dict[index], batches, state.matrix_approximation_rank)
    if need_random_q:
        with _shared_seed(state):  # drawn even for an all-uncompressed bucket, as torch does
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=like.dtype))
                _orthogonalize(q, state.orthogonalization_epsilon)
    else:
        for q in qs:
            _orthogonalize(q, state.orthogonalization_epsilon)
    for batch, q, p in zip(batches, qs, ps):
        torch.bmm(batch, q, out=p)
    return ps, qs


def _compute_qs(
    state: PowerSGDState, wire: Wire, index: int, batches, ps, qs, before: torch.futures.Future | None = None
) -> torch.futures.Future:
    """Steps 4-5 (torch's ``compute_qs``): sum the P's, orthogonalize them, Q = Mᵀ P; start the Q's sum.

    We *wait* for the P's here, because the Q's collective must be issued from the hook's call: one
    issued from a Future's callback runs on a backend thread at a moment that differs per rank, and
    could pair with another bucket's collective on the other rank. ``before`` (the uncompressed
    tensors' sum) is waited for too, so the Q's Future completes after both: the one Future the
    hook's last step hangs on.
    """
    wire.all_reduce(state.p_memory_dict[index]).wait()
    if before is not None:
        before.wait()
    for p in ps:  # no need to divide by the world size first
        _orthogonalize(p, state.orthogonalization_epsilon)
    for batch, p, q in zip(batches, ps, qs):
        torch.bmm(batch.transpose(1, 2), p, out=q)
    return wire.all_reduce(state.q_memory_dict[index])


def _unpack_uncompressed(uncompressed: list[torch.Tensor], averaged: torch.Tensor) -> None:
    """Step 6: the averaged uncompressed tensors, copied back into the bucket's gradients."""
    offset = 0
    for tensor in uncompressed:
        tensor.copy_(averaged[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


def _approximate(state: PowerSGDState, by_shape, batches, ps, qs) -> None:
    """Step 6 (torch's ``decompress``): M ≈ P Qᵀ written over each compressed matrix."""
    for p, q, batch in zip(ps, qs, batches):
        torch.bmm(p, q.transpose(1, 2), out=batch)
    if state.batch_tensors_with_same_shape:  # stacked copies: write back to the bucket
        for batch in batches:
            if batch.shape[0] > 1:
                for matrix, row in zip(by_shape[batch.shape[1:]], batch):
                    matrix.copy_(row)


def _carve(p_memory: torch.Tensor, q_memory: torch.Tensor, batches, max_rank: int):
    """Views (b x n x r) and (b x m x r) into the flat P and Q memory, one per batch.

    One flat tensor each for all P's and all Q's means one all_reduce each.
    """
    ps, qs, p_at, q_at = [], [], 0, 0
    for batch in batches:
        b, n, m = batch.shape
        rank = min(n, m, max_rank)
        ps.append(p_memory[p_at : p_at + b * n * rank].view(b, n, rank))
        qs.append(q_memory[q_at : q_at + b * m * rank].view(b, m, rank))
        p_at, q_at = p_at + b * n * rank, q_at + b * m * rank
    return ps, qs


# -- the whole-bucket hook ----------------------------------------------------------------------


def batched_powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> torch.futures.Future:
    """Compress the whole flat bucket as one square matrix (faster, usually less accurate).

    Layers are not kept apart, so low-rank structure is mostly lost; use it
    with rank 1, and prefer :func:`powerSGD_hook` unless speed matters more.
    Before ``state.start_powerSGD_iter`` steps this is :func:`allreduce_hook`.
    After:

    1. copy the bucket (length L) into a zero-padded s x s matrix M,
       s = ceil(sqrt(L)), adding the error feedback; keep a copy;
    2. take Q (s x r) from last step or draw it at random; orthogonalize it;
    3. P = M Q; all_reduce P and wait (see :func:`powerSGD_hook`, step 4);
    4. orthogonalize P; Q = Mᵀ P; all_reduce Q;
    5. when Q arrives: divide it by the world size, M ≈ P Qᵀ, memorise the
       local error, and write the first L entries back into the bucket.

    Unlike torch's version this never resizes the bucket's buffer (which may
    be a view of a parameter's ``.grad``), so it runs on gloo/CPU too.

    Example::

        >>> from minddp import DistributedDataParallel
        >>> ddp = DistributedDataParallel(torch.nn.Linear(16, 16))
        >>> ddp.register_comm_hook(PowerSGDState(None, start_powerSGD_iter=10), batched_powerSGD_hook)
    """
    check_real_floating(bucket, "batched_powerSGD_hook")
    vanilla = _vanilla_phase(state, bucket)
    if vanilla is not None:
        return vanilla
    wire = Wire.of(state.process_group)
    world_size = wire.size()
    input_tensor = bucket.buffer()
    device, dtype, index = input_tensor.device, input_tensor.dtype, bucket.index()
    length = input_tensor.numel()
    side = math.ceil(math.sqrt(length))
    rank = state.matrix_approximation_rank
    state.total_numel_before_compression += length
    state.total_numel_after_compression += 2 * side * rank
    state._report_compression_stats(bucket)

    padded = torch.zeros(side * side, device=device, dtype=dtype)  # step 1
    padded[:length].copy_(input_tensor)
    padded_copy = _add_error_feedback(state, index, padded)
    matrix = padded.view(side, side)

    if not state.warm_start or index not in state.p_memory_dict:  # step 2
        state.p_memory_dict[index] = torch.empty(side, rank, device=device, dtype=dtype)
        with _shared_seed(state):
            state.q_memory_dict[index] = torch.randn(side, rank, device="cpu", dtype=dtype).to(device)
    p, q = state.p_memory_dict[index], state.q_memory_dict[index]
    _orthogonalize(q.unsqueeze(0), state.orthogonalization_epsilon)
    torch.matmul(matrix, q, out=p)  # step 3
    wire.all_reduce(p).wait()
    _orthogonalize(p.unsqueeze(0), state.orthogonalization_epsilon)  # step 4
    torch.matmul(matrix.t(), p, out=q)
    q_fut = wire.all_reduce(q)

    def decompress(_: torch.futures.Future) -> torch.Tensor:  # step 5
        q.div_(world_size)
        torch.matmul(p, q.t(), out=matrix)
        if padded_copy is not None:
            state.error_dict[index] = padded_copy - padded
        if not state.warm_start:
            state.p_memory_dict.pop(index, None)
            state.q_memory_dict.pop(index, None)
        state.maybe_increase_iter(bucket)
        return input_tensor.copy_(padded[:length])

    return keep.then(q_fut, decompress)
