"""One module per command; each exposes `app: typer.Typer`. Thin: parse, call runtime/, render."""
