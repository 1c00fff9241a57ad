"""The TensorRT backend (`create(spec)`): the engines of `specdrive engines build` (one per graph of
`specdrive export onnx`) driven with numpy, TensorRT's Python API and cuda-python only.

The folder is the one the build wrote: ONNX graphs + meta.json (what the graphs are) and
manifest.json (profile, shapes, precision per graph, target SM, TensorRT range, engine hashes).
An engine whose manifest does not match this runtime (shapes, k_max, precision, SM, TensorRT
version, hashes) is refused naming the difference (`check_manifest`).

By layer:

    cuda.py         cuda-python's runtime calls, their errors checked, every allocation (Cuda)
    engine.py       one engine: deserialized, its I/O tensors and dtypes, shapes and optimization
                    profiles, static buffers (Engine); the manifest checked against this runtime
    cuda_graphs.py  the CUDA graphs of one engine, one per verify width, captured at warm-up
    buffers.py      device memory as typed sets: an engine's I/O buffers per role (`e.io.logits`),
                    the KV caches and tables; byte sizes from the buffers' dtypes
    backend.py      the Backend over the engines (TensorRTBackend) and `create(spec)`: device
                    memory, prefill, the target step and the draft chain; beside it, the parts
                    it is made of:
    trees.py        token trees: step_tree passes, the draft's tree, the accepted rows moved
    streaming.py    per-frame vision, the image_blocks engine and the streamed prefill
    action.py       the action expert on its own stream

Device memory, allocated once (cuda-python's `cudaMalloc`):

    cache, draft_cache   (layers, 2, 1, kv_heads, max_len, head_dim) KV, written by index, in the
                         dtype the engines bind it at (fp32 from the export, fp16 where built so)
    feats                (max_len + 1, F) target features; row r at index r + 1, index 0 zeros
    rope, draft_rope     (max_len, hd) cos / sin of every cache row (target: per prompt's delta)
    mask                 (P + rows, V) bool: the periodic mask tiled, a call reads n rows from
                         row (index0 - first) % P
    arange               (max_len,) int64 0..max_len-1: a call's `start` input is one element
    proposals            (max_len + k_max,) int64: the draft chain's arg-maxes, fed back on device
    I/O buffers          per engine, sized for the largest shape any optimization profile allows

A target step copies its inputs into the step engine's static buffers (device to device, from the
tables above), runs the engine (a CUDA graph per verify width, captured at start), writes the new K/V rows
into the cache with one cudaMemcpy2DAsync and reads back the arg-max. Per verify of n tokens the
host sends the n ids and reads n ids back (greedy); per draft call it sends the fed ids and reads
the k proposals once. The action expert runs on its own stream: it waits on an event recorded after
the last cache write, copies the cache rows it reads into its context buffer, and its Euler update
runs on the host (the export has no axpy graph; two (S, W, A) copies per Euler step).

Token trees (runtime/tree.py): the step_tree engine has an optimization profile per tree width
(the engine profile's shapes.tree_widths, e.g. 9, 17, 33: each covers the widths above the one
before and is tuned at its own), and each width's CUDA graph is captured at warm-up beside the
verify widths. A tree's pass is padded to the smallest width that holds it (a pad row sees the
prefix and itself, and no row sees it), so it replays a captured graph; per tree pass the host
sends the ids, the nodes' cos/sin rows and the (w, w) tree mask, and reads the arg-max back. The draft engines take no tree
mask: the best node of each depth is fed and its logits row comes back for its top-K. The accepted
path's K/V rows (and features) are moved on the device (keep_rows), so the caches stay contiguous.
The widest tree a build takes is its widest profile; a wider one is refused naming it.

Documentation followed: TensorRT 10.3 Python API and Developer Guide, CUDA Runtime API 12.x; each
module names the sections it follows.
"""
from runtime.backends.tensorrt.backend import TensorRTBackend, create  # noqa: F401
