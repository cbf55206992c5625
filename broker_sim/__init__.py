"""Workers (brokers) of zkcontroller, their task runners, and a simulator that runs many of them at
once with failure injection, for tests and benchmarks."""
