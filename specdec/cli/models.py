"""``specdec models``: pull, list and locate models (see ``specdec.registry``)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    m = sub.add_parser("models", help="pull, list and locate models")
    m.add_argument("action", choices=["pull", "list", "path"])
    m.add_argument("names", nargs="*")
    m.set_defaults(func=models)


def models(args: argparse.Namespace) -> int:
    from specdec import registry

    if args.action == "pull":
        for name in args.names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]:
            print(registry.pull(name))
    elif args.action == "list":
        rows = registry.list_models()
        print(f"{'alias':<22} {'role':<8} {'size':>9}  cached  path / description")
        for r in rows:
            size = f"{r['size'] / 1e6:.0f} MB" if r.get("size") else "-"
            where = r["path"] if r["cached"] else r.get("description", "")
            print(
                f"{r['alias']:<22} {r.get('role', ''):<8} {size:>9}  "
                f"{'yes' if r['cached'] else 'no':<6}  {where}"
            )
    elif args.action == "path":
        if not args.names:
            raise ValueError("specdec models path NAME: name a model")
        print(registry.model_path(args.names[0]))
    return 0
