from tilewise.cli import entry

raise SystemExit(entry())
