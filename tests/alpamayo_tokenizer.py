"""A tokenizer.json in the Alpamayo-R1 release layout, built with the `tokenizers` library: Qwen's
format (a merge-free byte-level BPE stand-in for Qwen's, Qwen's added tokens in Qwen's order),
then Alpamayo's added tokens as upstream adds them (base_model.py)."""
import tokenizers

from models.alpamayo import RELEASE_TOKENS

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
              "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
              "<think>", "</think>"]
# base_model.py SPECIAL_TOKENS_KEYS, in order (add_special_tokens=True adds all of them)
ALPAMAYO_SPECIAL = [f"<|{k}|>" for k in (
    "prompt_start", "prompt_end", "image_start", "image_pre_tkn", "image_end", "traj_history_start",
    "traj_history_pre_tkn", "traj_history_end", "cot_start", "cot_end", "meta_action_start",
    "meta_action_end", "traj_future_start", "traj_future_pre_tkn", "traj_future_end", "traj_history",
    "traj_future", "image_pad", "vectorized_wm", "vectorized_wm_start", "vectorized_wm_end",
    "vectorized_wm_pre_tkn", "route_start", "route_pad", "route_end", "question_start", "question_end",
    "answer_start", "answer_end")]
FUTURE_BINS, HIST_BINS = 8, 32
TOKENS = {"traj_vocab_size": FUTURE_BINS + HIST_BINS,
          "traj_tokenizer_cfg": {**RELEASE_TOKENS["traj_tokenizer_cfg"], "num_bins": FUTURE_BINS},
          "hist_traj_tokenizer_cfg": {**RELEASE_TOKENS["hist_traj_tokenizer_cfg"], "num_bins": HIST_BINS}}


def byte_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet Qwen uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


BYTES = byte_unicode()
ALPHABET = {c: i for i, c in enumerate(sorted(BYTES.values()))}


def text_ids(s: str) -> list[int]:
    """Ids of plain text in this merge-free byte-level BPE: one id per UTF-8 byte."""
    return [ALPHABET[BYTES[b]] for b in s.encode()]


def qwen_alpamayo_tokenizer() -> "tokenizers.Tokenizer":
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    tk = tokenizers.Tokenizer(models.BPE(vocab=dict(ALPHABET), merges=[]))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(QWEN_SPECIAL)
    tk.add_tokens(QWEN_ADDED)
    tk.add_tokens([f"<i{v}>" for v in range(TOKENS["traj_vocab_size"])])   # base_model._build_tokenizer
    tk.add_special_tokens(ALPAMAYO_SPECIAL)                                 # <|image_pad|> exists already
    return tk
