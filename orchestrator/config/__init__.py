"""pydantic models for every file pairctl reads, and one loader that names file, field and reason."""
