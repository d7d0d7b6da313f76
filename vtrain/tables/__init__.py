"""Profile tables: their schemas, how they are built from ingested events, and how they are stored."""
