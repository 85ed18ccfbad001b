"""a server under load, bad input and long runs (OpenAI-compatible clients)"""
