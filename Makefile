# specdrive — two commands for a newcomer: `make demo` and `make test`.
# Each creates .venv if it is missing and installs what it needs, from nothing but Python.
#
# TORCH   the torch requirement installed first. Default: the CPU build for development.
#         On Jetson/DRIVE Orin use the JetPack wheel, e.g.
#           make test TORCH=/path/to/torch-2.5.0a0+...-linux_aarch64.whl
#         or TORCH= VENV_FLAGS=--system-site-packages to reuse the system's torch.
# ORT     which ONNX Runtime extra: ort-cpu (default) or ort-gpu. Never both.
# TEST_JOBS  pytest worker processes of `make test` (pytest-xdist; each test file runs whole in one
#         worker, torch on one thread in each). 3 on a 2-core machine: a worker waiting for the
#         shared ONNX export or a subprocess leaves its core to another. 0 runs in this process.
PYTHON     ?= python3
VENV       ?= .venv
VENV_FLAGS ?=
TORCH      ?= torch==2.13.0
ORT        ?= ort-cpu
TEST_JOBS  ?= 3
EXTRAS     ?= torch,$(ORT),plots,quant,dev
PY          = $(VENV)/bin/python
STAMP       = $(VENV)/.specdrive-installed
# TensorRT Edge-LLM's exporter (tests/test_edgellm.py runs it as a subprocess): a venv of its own,
# because its `export` extra pins transformers, onnx and numpy versions that conflict with ours.
# Its vision export imports tensorrt_edgellm.quantization (modelopt, datasets, ...), which only the
# package's `tools` extra brings. That extra also pins torchvision, whose PyPI build does not load
# beside the CPU torch: every exporter run then fails on import ("operator torchvision::nms does not
# exist"). Nothing of the exporter needs it, so a torchvision that does not import is removed.
EDGELLM_VENV ?= .venv-edgellm
EDGELLM      ?= tensorrt-edgellm[export,tools]==0.11.0
EDGELLM_STAMP = $(EDGELLM_VENV)/.edgellm-installed

.PHONY: all install edgellm test lint demo scenes train train-causal claims engines engines-cpu bench bench-ort profile drive results report tools clean help

all: test

help:
	@echo "make demo     run the planner on a few scenes (CPU) and leave pictures in out/demo"
	@echo "make test     install into .venv if needed, check import contracts and Python 3.10, run the test suite"
	@echo "make train    reproduce checkpoints/tiny from scratch (~100 min on 2 CPU cores)"
	@echo "make train-causal  the same target in the HF causal image layout -> checkpoints/tiny-causal and its card (for Edge-LLM, TensorRT-LLM)"
	@echo "make claims   the seed paper's claims measured with five seeds and seed-level intervals -> docs/claims-data.md"
	@echo "make bench    speculative vs plain decoding on the shipped checkpoints -> out/bench"
	@echo "make engines PROFILE=orin-fp16|orin-int8|thor-fp8|hopper-fp8  export -> calibrate -> TensorRT build"
	@echo "make engines-cpu  export the shipped checkpoint to ONNX (-> build/engines/tiny-ort) for --engines"
	@echo "make profile  stage ranges of planner cycles (nsys on a GPU, else a Chrome trace) -> out/profile"
	@echo "make results  re-run every run with no results (neither its JSON nor results/RUN.json) or of another checkpoint, then re-render the tables of README.md and docs/"
	@echo "make drive    closed-loop drives (4 test drives x 4 s, plain/speculative, budget on/off) at this CPU's and a simulated Orin latency -> out/drive"

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ -n "$(TORCH)" ]; then $(PY) -m pip install -q "$(TORCH)"; fi
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

install: $(STAMP)

# Python 3.10 is the floor (requires-python; JetPack 6 on Orin): no syntax or standard library newer,
# in any .py of the tree (tests/test_structure.py checks that PY_TREE holds them all and that
# the check fails on a planted 3.11 file). --pessimistic: a file this Python cannot parse fails
# (`except*` on 3.10); --violations only says what (vermin 1.9 then exits 0 on a file it cannot
# parse); --exclude long: vermin reads torch's Tensor.long() as Python 2's long.
PY_TREE = core prompt scenes models runtime train export calibration engines bench tools tests $(wildcard configs scripts)
PY310   = vermin -q -t=3.10- --no-tips --eval-annotations --pessimistic --exclude long

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/$(PY310) $(PY_TREE) || { $(VENV)/bin/$(PY310) --violations $(PY_TREE); exit 1; }

# The Edge-LLM venv (~1 GB with torch). A machine where it cannot install (the wheel is built for
# CPython 3.11 on x86_64 and aarch64 Linux) still runs `make test`: the exporter test then skips,
# naming the package.
$(EDGELLM_STAMP): Makefile
	@test -x $(EDGELLM_VENV)/bin/python || $(PYTHON) -m venv $(EDGELLM_VENV)
	$(EDGELLM_VENV)/bin/python -m pip install -q --upgrade pip
	@if [ -n "$(TORCH)" ]; then $(EDGELLM_VENV)/bin/python -m pip install -q "$(TORCH)"; fi
	$(EDGELLM_VENV)/bin/python -m pip install -q "$(EDGELLM)"
	@$(EDGELLM_VENV)/bin/python -c "import torchvision" 2>/dev/null || $(EDGELLM_VENV)/bin/python -m pip uninstall -q -y torchvision
	@touch $(EDGELLM_STAMP)

edgellm:
	@$(MAKE) --no-print-directory $(EDGELLM_STAMP) || echo "make edgellm: $(EDGELLM) did not install; tests/test_edgellm.py will skip"

# The two environments install side by side (pip waits on disk and network as much as on a core).
test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) edgellm
	@$(MAKE) --no-print-directory lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -rs -n $(TEST_JOBS) --dist loadfile

demo: $(STAMP)
	$(PY) -m tools.cli demo --out out/demo

scenes: $(STAMP)
	$(PY) -m tools.cli scenes generate --out data/scenes --n 12000 --seed 0 --workers 2

# Reproduce checkpoints/tiny from scratch (data, vision pretraining, SFT, distillation, AARL,
# ship, model card); ~2 h 10 min on 2 CPU cores (data 5, vision 25, SFT 87, drafts + AARL 8, eval ~20).
train: $(STAMP)
	$(PY) -m tools.cli scenes generate --out data/scenes --n 12000 --seed 0 --workers 2
	$(PY) -m tools.cli train vision --config configs/train/vision.yaml
	$(PY) -m tools.cli train sft --config configs/train/sft.yaml
	$(PY) -m tools.cli train distill --config configs/train/distill.yaml
	$(PY) -m tools.cli train distill --config configs/train/distill-standalone.yaml
	$(PY) -m tools.cli train distill --config configs/train/distill-vocab.yaml
	$(PY) -m tools.cli train distill --config configs/train/distill-eagle3.yaml
	$(PY) -m tools.cli train aarl --config configs/train/aarl.yaml
	$(PY) -m tools.cli train ship --config configs/train/ship.yaml
	$(PY) -m tools.cli train eval --config configs/train/eval.yaml

# The same target in the HF-exact causal image layout (the shipped one is frame-local), its flat
# and EAGLE-3 drafts, and both targets evaluated on validation scenes (needs data/scenes and
# runs/vision-tiny from `make train`; ~100 min on 2 CPU cores). It is what runtimes with their own
# causal mask take (`specdrive export edgellm`, which takes checkpoints/tiny-causal, TensorRT-LLM) and
# what the approximate streaming mode runs on.
train-causal: $(STAMP)
	$(PY) -m tools.cli train sft --config configs/train/sft-causal.yaml
	$(PY) -m tools.cli train distill --config configs/train/distill-causal.yaml
	$(PY) -m tools.cli train distill --config configs/train/distill-eagle3.yaml --set target=runs/sft-tiny-causal/ckpt \
		--set run.out=runs/distill-tiny-causal
	$(PY) -m tools.cli train ship --config configs/train/ship-causal.yaml
	$(PY) -m tools.cli train eval --config configs/train/eval-layouts.yaml
	$(PY) -m tools.cli train eval --config configs/train/eval-layouts.yaml --set planner=checkpoints/tiny-causal \
		--set out=runs/eval-causal-val/metrics.json
	$(PY) -m tools.cli train eval --config configs/train/eval-causal.yaml

# The seed paper's claims on world v2 (docs/claims.md): five seeds of every draft variant and of
# AARL's shipped recipe, then one evaluation on 200 scenes per split with seed-level intervals
# (~100 min on 2 CPU cores; needs data/scenes (`make scenes`); the drafts are trained against the
# shipped target, checkpoints/tiny).
claims: $(STAMP)
	PY=$(PY) bash configs/train/claims.sh

# The shipped checkpoint as ONNX graphs for the onnxruntime backend (about a minute on 2 cores);
# then: specdrive plan --engines build/engines/tiny-ort ...
ENGINES_CPU = build/engines/tiny-ort
engines-cpu: $(ENGINES_CPU)/meta.json

$(ENGINES_CPU)/meta.json: $(STAMP) checkpoints/tiny/target/meta.json
	$(PY) -m tools.cli export onnx --checkpoint checkpoints/tiny --out $(ENGINES_CPU)

# The same bench on the ONNX Runtime backend (graphs from make engines-cpu).
bench-ort: engines-cpu
	$(PY) -m tools.cli bench --engines $(ENGINES_CPU) --backend onnxruntime --scenes 16 --seed 0 --json out/bench-ort/bench.json

# Speculative vs plain decoding on the shipped checkpoints (table, JSON, plots in out/bench).
bench: $(STAMP)
	$(PY) -m tools.cli bench --checkpoint checkpoints/tiny --scenes 16 --seed 0 --ks 4,8,16 --json out/bench/bench.json

# Every measurement table of README.md and docs/ from its run's stamped summary in results/ (cut from
# the run's own JSON by `specdrive report`; bench/report/registry.py): re-runs what has neither or is
# stamped with another checkpoint than checkpoints/tiny, then re-renders; `make report` only re-renders.
results: $(STAMP)
	$(PY) -m tools.cli report --run-stale

report: $(STAMP)
	$(PY) -m tools.cli report

# Profile planner cycles on the shipped checkpoint: under Nsight Systems where nsys and a GPU are
# (report out/profile/profile_cpu_torch_tiny.nsys-rep), else ranges recorded here (out/profile:
# trace.json, stats.md, pictures); then the tiny model's roofline on this CPU against the run.
# PROFILE_ARGS adds options, e.g. PROFILE_ARGS="--device cuda --profile orin".
# closed loop: the ego follows each plan from the moment it is delivered (docs/drive.md)
drive: $(STAMP)
	$(PY) -m tools.cli drive --checkpoint checkpoints/tiny --drives 4 --seconds 4 \
		--latency measured,orin-agx-64:edge-2b --budget-ms 250,700 --out out/drive

profile: $(STAMP)
	$(PY) -m tools.cli profile --checkpoint checkpoints/tiny --cycles 16 --out out/profile $(PROFILE_ARGS)
	@if [ -f out/profile/stats.json ]; then $(PY) -m tools.cli roofline --preset tiny --device cpu --memory \
		--validate out/profile/stats.json --json out/profile/roofline_cpu.json; fi

# Engines for an engine profile (configs/engines/PROFILE.yaml): export -> calibrate -> build, into
# engines/build/PROFILE. The checkpoint: checkpoints/tiny, or checkpoints/tiny-causal for a
# profile that also writes TensorRT-LLM checkpoints (thor-fp8, hopper-fp8: a causal mask of its
# own). Without TensorRT (as here) every step before the build runs, manifest.json says built:
# false and how to install TensorRT on the device, and the command exits 3.
PROFILE ?= orin-fp16
engines: $(STAMP)
	$(PY) -m tools.cli engines build --profile $(PROFILE) --out engines/build/$(PROFILE)

clean:
	rm -rf out build engines/build dist *.egg-info .pytest_cache .import_linter_cache
