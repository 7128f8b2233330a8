"""specdeploy: speculative decoding on Kubernetes, planned, rendered and rolled back."""
