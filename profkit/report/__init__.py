"""Renderers: terminal tables now; Markdown, HTML and Perfetto later."""
