"""`python -m bench`: every question and its subcommands."""

from bench.dispatch import QUESTIONS, subcommands

print("python -m bench.<question> <subcommand> [--help]\n")
for question, what in QUESTIONS.items():
    print(f"{question}: {what}")
    for name, line in subcommands(question).items():
        print(f"  {name:<20} {line}")
print("\nexactness: python -m bench.exactness [--help] (the three equalities on real shapes)")
print("compare:   python -m bench.compare A.json B.json (a regression gate between two results)")
print("plots:     python -m bench.plots RESULT.json")
