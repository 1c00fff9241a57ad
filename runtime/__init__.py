"""specdrive's on-vehicle runtime: the planner loop, speculative decoding, the latency budget.

numpy + the standard library + prompt/ only; engine libraries are imported by the backend
that is chosen (runtime.backend.load_backend). Entry points: runtime.planner.Planner,
runtime.loop.generate, `specdrive plan` (tools/plan.py). See runtime/README.md.
"""
