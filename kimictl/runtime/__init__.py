"""The domain of kimictl, importable without Typer or Textual (see DESIGN.md, Layering)."""
