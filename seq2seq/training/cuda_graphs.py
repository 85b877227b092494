"""The training step's forward and backward as CUDA graphs, one graph per batch shape.

On a GPU our update is bound by the host, not the device: about 1,300 kernel launches and
7,700 operator calls for 7 ms of kernels (docs/performance.md, "The host-bound update").
A graph replays all of a forward's or a backward's kernels in one launch. It needs fixed shapes
and addresses, so one is captured (torch.cuda.make_graphed_callables) the first time a (batch,
source length, target length) shape is trained, and replayed for every later batch of that
shape, the batch copied into the graph's own input tensors. Token-budget batches of a corpus
take the same few dozen shapes every epoch (the cut depends on the lengths alone), so the
captures happen in the first epoch; `data.pad_to_multiple` makes them fewer. The loss scores
every target position with padding weighted 0 (`Transformer.loss(static_shapes=True)`):
selecting the scored positions would give a shape that depends on the data. Dropout draws
from torch's CUDA generator, whose seed and offset a replay reads as it starts, so the
per-step seeding of the module keeps resumed runs exact.

Captures watch the capturing thread alone (CUDA's "thread_local" mode): in the "global" mode,
the loader's pin-memory thread pinning the next batch during a capture invalidated it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.data.batching import Batch
from seq2seq.model.transformer import Transformer

log = logging.getLogger(__name__)

WARMUP_STEPS = 2  # eager steps on the capture's side stream before it (cuBLAS, allocator)
CAPTURE_MODE = "thread_local"  # cudaStreamCaptureMode: unsafe calls of other threads allowed


class SummedLoss(nn.Module):
    """The summed training loss of a batch, a function of tensors alone (what a graph holds)."""

    def __init__(self, model: Transformer, label_smoothing: float, r_drop: float | None) -> None:
        super().__init__()
        self.model, self.label_smoothing, self.r_drop = model, label_smoothing, r_drop

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        return self.model.loss(
            src, tgt_in, tgt_out, self.label_smoothing, static_shapes=True, r_drop=self.r_drop
        )


class GraphedLoss:
    """The summed loss of training batches through CUDA graphs, captured per batch shape up
    to `max_shapes` of them; batches of further shapes run eagerly (the static-shape loss).
    `r_drop`: R-Drop's alpha, or None (Transformer.loss)."""

    def __init__(
        self, model: Transformer, label_smoothing: float, r_drop: float | None, max_shapes: int
    ) -> None:
        self.model, self.label_smoothing, self.r_drop = model, label_smoothing, r_drop
        self.max_shapes = max_shapes
        self.graphs: dict[tuple[int, ...], SummedLoss] = {}  # not submodules: no state dict
        self._eager = SummedLoss(model, label_smoothing, r_drop)
        self._full_logged = False

    def __call__(self, batch: Batch, reseed: Callable[[], None]) -> Tensor:
        """The summed loss of `batch`; `reseed` redraws the step's seed after a capture,
        whose warm-up steps draw dropout masks too."""
        inputs = (batch.src, batch.tgt_in, batch.tgt_out)
        shape = (*batch.src.shape, batch.tgt_in.shape[1])
        graphed = self.graphs.get(shape)
        if graphed is None:
            if len(self.graphs) >= self.max_shapes:
                if not self._full_logged:
                    log.warning(
                        "cuda_graphs: %d batch shapes captured, the limit; batches of further "
                        "shapes run without a graph (raise cuda_graphs if GPU memory allows)",
                        self.max_shapes,
                    )
                    self._full_logged = True
                return self._eager(*inputs)
            graphed = self.capture(inputs)
            self.graphs[shape] = graphed
            log.info(
                "cuda_graphs: captured batch shape %s (%d of at most %d)",
                shape,
                len(self.graphs),
                self.max_shapes,
            )
            reseed()
        return graphed(*inputs)

    def capture(self, inputs: tuple[Tensor, ...]) -> SummedLoss:
        """A forward and a backward graph for batches shaped as `inputs`. Autocast's cache
        would hold casts made outside the graph, so the capture runs without it."""
        device = inputs[0].device.type
        autocast = torch.autocast(
            device,
            dtype=torch.get_autocast_dtype(device),
            enabled=torch.is_autocast_enabled(device),
            cache_enabled=False,
        )
        static_inputs = tuple(t.clone() for t in inputs)
        with autocast:
            return make_graphed_callables(
                SummedLoss(self.model, self.label_smoothing, self.r_drop),  # its own forward
                static_inputs,
                num_warmup_iters=WARMUP_STEPS,
                allow_unused_input=True,
            )


def make_graphed_callables(module: nn.Module, inputs: tuple[Tensor, ...], **kwargs) -> nn.Module:
    """torch.cuda.make_graphed_callables, capturing in CAPTURE_MODE. Where it takes no
    capture_error_mode (torch 2.11, for one), it captures through torch.cuda.graph, whose
    default the mode then is while the capture runs."""
    if "capture_error_mode" in inspect.signature(torch.cuda.make_graphed_callables).parameters:
        return torch.cuda.make_graphed_callables(
            module, inputs, capture_error_mode=CAPTURE_MODE, **kwargs
        )
    graph = torch.cuda.graph

    class ThreadLocalGraph(graph):
        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode=CAPTURE_MODE):
            super().__init__(cuda_graph, pool, stream, capture_error_mode)

    torch.cuda.graph = ThreadLocalGraph
    try:
        return torch.cuda.make_graphed_callables(module, inputs, **kwargs)
    finally:
        torch.cuda.graph = graph
