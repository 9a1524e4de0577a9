"""The HTTP server around the API: the app and its lifespan, the middleware, the hot lane, the
one map from errors to responses, and uvicorn."""
