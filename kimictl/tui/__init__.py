"""Textual screens and widgets; reads kimictl.runtime only."""
