"""The embedded default: local sshd hosts, the pinned llama.cpp source, tiny models."""
