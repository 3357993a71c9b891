"""Serving benchmarks: many requests at once (batch sizes, the server under load, agent traces turn
by turn and through the server, the prefix cache), short requests, structured output and the
server's memory."""
