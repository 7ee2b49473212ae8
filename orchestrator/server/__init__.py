"""llama-server over HTTP: a client (`client.ServerClient`) and pure parsers of its responses."""
