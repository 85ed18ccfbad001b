"""lanes against llama.cpp on the CPU"""
