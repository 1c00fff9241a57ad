"""The parity tests' prompt and forward passes: two images between text runs, logits from a
transformers Qwen-VL model and from our Target, our M-RoPE positions of the prompt."""
import numpy as np
import torch

from prompt.pixels import images_to_patches
from prompt.positions import mrope_position_ids

V, IMG, VS, VE, VID = 300, 290, 291, 292, 293
TOL = 1e-4


def two_image_prompt() -> dict:
    """Two images (32x48 and 48x32 -> 6 merged tokens each) between text runs."""
    rng = np.random.default_rng(0)
    parts = [images_to_patches(rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8), 8, 2, 2)
             for h, w in ((32, 48), (48, 32))]
    text = lambda n: rng.integers(0, 280, n).tolist()  # noqa: E731
    ids = (text(5) + [VS] + [IMG] * 6 + [VE] + text(3) + [VS] + [IMG] * 6 + [VE] + text(7))
    return dict(ids=torch.tensor([ids]), pixels=torch.tensor(np.concatenate([p for p, _ in parts])),
                grid=torch.tensor(np.concatenate([g for _, g in parts])))


def hf_logits(hf, prompt):
    with torch.no_grad():
        return hf(input_ids=prompt["ids"], pixel_values=prompt["pixels"],
                  image_grid_thw=prompt["grid"],
                  mm_token_type_ids=(prompt["ids"] == IMG).int()).logits


def our_logits(target, prompt, positions):
    with torch.no_grad():
        embeds, deepstack = target.encode_images(prompt["pixels"], prompt["grid"])
        cos, sin = target.rope(torch.as_tensor(positions)[:, None])
        return target(prompt["ids"], cos, sin, image_embeds=embeds, deepstack=deepstack)[0]


def our_positions(prompt):
    return mrope_position_ids(prompt["ids"][0].numpy(), prompt["grid"].numpy(), 2, IMG, VS)
