"""`specdrive scenes generate|show`: thin wiring onto scenes.dataset and scenes.show."""
from __future__ import annotations

from scenes.config import FAMILIES, SPLITS, ConfigError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("scenes", help="synthetic driving world: generate datasets, draw a scene")
    sub = p.add_subparsers(dest="scenes_command", metavar="ACTION")
    sub.required = True
    g = sub.add_parser("generate", help="write train/val/test/heldout/unseen shards")
    g.add_argument("--out", required=True, help="dataset directory")
    g.add_argument("--n", type=int, required=True, help="number of scenes over all splits")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--families", default=",".join(FAMILIES),
                   help=f"comma-separated subset of: {','.join(FAMILIES)} (default: all)")
    g.add_argument("--workers", type=int, default=1, help="processes (the bytes do not depend on it)")
    g.add_argument("--shard-size", type=int, default=256, help="scenes per shard")
    g.add_argument("--no-render", action="store_true", help="skip the camera images (trajectories and text only)")
    g.set_defaults(run=_generate)
    s = sub.add_parser("show", help="draw one scene (cameras, bird's-eye view, CoC) to a PNG")
    s.add_argument("dataset", help="dataset directory")
    s.add_argument("--index", type=int, default=0)
    s.add_argument("--split", default="train", choices=SPLITS)
    s.add_argument("--out", required=True, help="PNG file to write")
    s.set_defaults(run=_show)


def _generate(args) -> int:
    from scenes.dataset import GenerateConfig, generate

    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    cfg = GenerateConfig(args.out, args.n, args.seed, families, args.workers, args.shard_size, not args.no_render)
    manifest = generate(cfg)
    counts = ", ".join(f"{k} {v['count']}" for k, v in manifest["splits"].items())
    print(f"wrote {cfg.n} scenes to {cfg.out}: {counts}")
    return 0


def _show(args) -> int:
    from scenes.dataset import load
    from scenes.show import draw

    data = load(args.dataset, args.split)
    if len(data) == 0:
        raise ConfigError(f"split {args.split!r} of {args.dataset!r} has no scenes")
    if not 0 <= args.index < len(data):
        raise ConfigError(f"--index {args.index} is out of range for split {args.split!r} of {args.dataset!r}; "
                          f"allowed 0..{len(data) - 1}")
    scene = data[args.index]
    if scene.images is None:
        raise ConfigError(f"{args.dataset!r} was generated with --no-render; it has no images to draw")
    draw(scene, args.out)
    print(f"wrote {args.out}")
    return 0
