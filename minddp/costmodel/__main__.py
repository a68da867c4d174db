"""``python -m minddp.model``: validate | project | predict (see each one's --help)."""

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {
        "validate": "minddp.costmodel.validate",
        "project": "minddp.costmodel.project",
        "predict": "minddp.costmodel.runs",
    }
    if not argv or argv[0] not in commands:
        print(
            f"usage: python -m minddp.model {{{','.join(commands)}}} [options]   (--help after one for its options)",
            file=sys.stderr,
        )
        return 2
    import importlib

    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
