"""OpenAI-compatible HTTP server: `specdecode serve`."""
