"""where the time goes: profiler windows and traces"""
