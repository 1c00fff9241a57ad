"""A Hugging Face tokenizer.json with Alpamayo-R1's added tokens, read with the `tokenizers`
library (no transformers on the vehicle). Loaded only when a folder carries such a tokenizer
(prompt.tokenizer.load_tokenizer); the prompt contract then runs in the "alpamayo" layout.

    tok = AlpamayoTokenizer.load(folder)     folder/tokenizer.json + folder/config.json (release)

Token rules from upstream NVlabs/alpamayo @ 1cba38c, src/alpamayo_r1/models/base_model.py:
  - the trajectory tokens <i0> .. <i{traj_vocab_size-1}> are added after Qwen's vocabulary;
    traj_token_start_idx is the id of <i0>;
  - future (traj_tokenizer_cfg) bins start at <i0>; with a hist_traj_tokenizer_cfg the history
    bins start traj_tokenizer.vocab_size (its num_bins) later (hist_token_start_idx);
  - add_special_tokens: every <|name|> of SPECIAL_TOKENS_KEYS is added (else only TRAJ_TOKEN);
  - while reasoning, [traj_token_start_idx, + traj_vocab_size) is masked (alpamayo_r1.py,
    ExpertLogitsProcessor), and the expert reads the cache through <|traj_future_start|>
    (the generation stops one token after it; offset = its index + 1);
  - v0 is estimate_t0_states' regularised least squares (action_space_cfg v_lambda, v_ridge).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from core.config import ConfigError, read_json
from prompt.layout import Conditioning
from prompt.trajectory import HIST_POSES, delta_history_bins
from prompt.vocab import VocabMasks

# attribute -> token, the ids the prompt contract reads (tok.cot_end, ...)
TOKENS = {name: f"<|{name}|>" for name in (
    "im_start", "im_end", "vision_start", "vision_end", "image_pad", "traj_history_start",
    "traj_history", "traj_history_end", "traj_future_start", "traj_future_end", "cot_start", "cot_end")}
PAD = "<|endoftext|>"          # Qwen's pad token
DELTA = "DeltaTrajectoryTokenizer"


class AlpamayoTokenizer(VocabMasks):
    """The prompt contract over a HF tokenizer: special-token ids as attributes, trajectory id
    ranges, masks, history tokens, `layout = "alpamayo"` and upstream's conditioning."""
    layout = "alpamayo"
    token_trajectory = False     # future tokens are (accel, curvature) bins: no x/y token output

    def __init__(self, hf: HFTokenizer, release: dict, where: str = "tokenizer.json"):
        self.hf, self.where = hf, where
        self._size = hf.get_vocab_size(with_added_tokens=True)
        self.traj_vocab_size = int(release.get("traj_vocab_size", 768))   # upstream default
        start = self.id("<i0>")
        last = f"<i{self.traj_vocab_size - 1}>"
        if self.id(last) != start + self.traj_vocab_size - 1:
            raise ConfigError(f"{where}: {last} has id {self.id(last)}, expected {start + self.traj_vocab_size - 1} "
                              "(the trajectory tokens must be consecutive from <i0>)")
        future_cfg, hist_cfg = release.get("traj_tokenizer_cfg"), release.get("hist_traj_tokenizer_cfg")
        n_future = int(future_cfg["num_bins"]) if future_cfg else 0
        self.traj_ids = range(start, start + self.traj_vocab_size)
        self.fut_ids = self.fut_x_ids = self.fut_y_ids = range(start, start + n_future)
        hist_cfg = hist_cfg if hist_cfg is not None else future_cfg
        if not hist_cfg or not str(hist_cfg.get("_target_", DELTA)).endswith(DELTA) or hist_cfg.get("predict_yaw"):
            raise ConfigError(f"{where}: history tokenizer {hist_cfg!r} is not supported; specdrive reads "
                              f"{DELTA} (predict_yaw false) histories")
        self.hist_cfg = {"num_bins": int(hist_cfg.get("num_bins", 1000)),
                         "xyz_min": tuple(hist_cfg.get("ego_xyz_min", (-4.0, -4.0, -10.0))),
                         "xyz_max": tuple(hist_cfg.get("ego_xyz_max", (4.0, 4.0, 10.0)))}
        hist_start = start + (n_future if release.get("hist_traj_tokenizer_cfg") is not None else 0)
        self.hist_ids = range(hist_start, hist_start + self.hist_cfg["num_bins"])
        if self.hist_ids.stop > self.traj_ids.stop:
            raise ConfigError(f"{where}: history bins end at {self.hist_ids.stop}, past the "
                              f"{self.traj_vocab_size} trajectory tokens from <i0> ({self.traj_ids.stop})")
        want = release.get("tokens_per_history_traj")
        if want is not None and int(want) != 3 * HIST_POSES:
            raise ConfigError(f"{where}: tokens_per_history_traj={want}; the history is {HIST_POSES} poses x "
                              f"(x, y, z) = {3 * HIST_POSES} delta tokens")
        for name, token in TOKENS.items():
            setattr(self, name, self.id(token))
        self.pad = self.unk = hf.token_to_id(PAD) if hf.token_to_id(PAD) is not None else 0
        space = release.get("action_space_cfg") or {}
        self.conditioning = Conditioning("traj_future_start", "least_squares",
                                         float(space.get("v_lambda", 1e-6)), float(space.get("v_ridge", 1e-4)))
        if "vocab_size" in release and int(release["vocab_size"]) != len(self):
            raise ConfigError(f"{where}: {len(self)} tokens but config.json vocab_size={release['vocab_size']}")
        settings = {k: release.get(k) for k in ("traj_vocab_size", "traj_tokenizer_cfg", "hist_traj_tokenizer_cfg")}
        self._settings = json.dumps(settings, sort_keys=True)

    @classmethod
    def load(cls, folder) -> "AlpamayoTokenizer":
        folder = Path(folder)
        release = read_json(folder / "config.json", "Alpamayo-R1 config")
        try:
            hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:   # the library raises its own exception type
            raise ConfigError(f"{folder / 'tokenizer.json'}: not a Hugging Face tokenizer ({e})") from None
        tok = cls(hf, release, str(folder / "tokenizer.json"))
        tok._file_sha = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
        return tok

    def __len__(self) -> int:
        return self._size

    def id(self, token: str) -> int:
        i = self.hf.token_to_id(token)
        if i is None:
            raise ConfigError(f"{self.where}: token {token!r} is not in the tokenizer (a release tokenizer "
                              "has Alpamayo-R1's added tokens)")
        return i

    def token(self, i: int) -> str:
        t = self.hf.id_to_token(int(i))
        if t is None:
            raise KeyError(f"id {i} is outside the vocabulary [0, {len(self)})")
        return t

    def encode(self, text: str) -> list[int]:
        """Text -> ids as transformers' tokenizer(text) does (added tokens split out first)."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def history_tokens(self, history) -> np.ndarray:
        """(16, 3) poses -> 48 history token ids (delta bins + hist_token_start_idx)."""
        return delta_history_bins(history, **self.hist_cfg) + self.hist_ids.start

    def masks(self) -> dict[str, np.ndarray]:
        v = np.arange(len(self))
        inside = lambda r: (v >= r.start) & (v < r.stop)   # noqa: E731
        traj = inside(self.traj_ids)
        return {"history": inside(self.hist_ids), "future": inside(self.fut_ids), "trajectory": traj,
                "text": ~traj}

    @property
    def fingerprint(self) -> str:
        """sha256 of the tokenizer file and the trajectory-token settings that give ids meaning."""
        base = getattr(self, "_file_sha", None) or hashlib.sha256(self.hf.to_str().encode()).hexdigest()
        return hashlib.sha256((base + self._settings).encode()).hexdigest()
