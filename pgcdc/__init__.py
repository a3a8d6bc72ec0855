"""pgcdc: change data capture from PostgreSQL into Kafka and Delta tables."""

__version__ = "0.1.0"
