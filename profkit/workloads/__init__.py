"""Request drivers that run against a live server: the study's agentic multi-turn replay."""
