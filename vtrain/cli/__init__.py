"""The `vtrain` command line: one module per command, registered in :mod:`vtrain.cli.main`."""
