"""The support dashboard: FastAPI service, storage and the review queue."""
