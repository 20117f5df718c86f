"""The `rollstream` command's entry point: Ctrl+C while the CLI is still importing exits 130
quietly instead of printing a traceback of the import machinery."""

from __future__ import annotations


def main() -> int:
    try:
        from rollstream.cli import main as cli_main
    except KeyboardInterrupt:
        return 130
    return cli_main()
