"""Kohya Studio web UI: a Gradio app over the in-process trainer (see DESIGN.md)."""
