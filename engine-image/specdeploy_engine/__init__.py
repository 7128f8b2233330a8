"""The engine pod image: launcher, GPU preflight and the engine simulator."""
