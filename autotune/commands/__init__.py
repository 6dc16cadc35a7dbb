"""Subcommands of the `autotune` CLI (see autotune/cli.py for the convention)."""
