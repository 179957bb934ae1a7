"""HTTP routes. Each route parses, calls a service and returns JSON or a stream."""
