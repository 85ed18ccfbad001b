"""Everyday chat prompts for `lanes distill`, written by the target itself from seed topics.

A drafter trained only on documentation and Shakespeare prompts drafts poorly on what users
actually send. Self-instruct style, the target is asked to write the user turns: one question
or request about a seed topic (coding, math, writing, advice, science, trivia), a short
document (an email, a notice, a recipe, ...) for document + question prompts, and its own first
answer for two-turn conversations that end in a follow-up. Some prompts get a system prompt.
The seeds below are lanes' own and share no text with the held-out set
(bench/data/everyday_prompts.json, checked by tests/test_everyday.py).

`generate(conversations, max_new_tokens, temperature) -> texts` is the target (distill passes
the dense teacher); every call is one batch.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

Generate = Callable[[list[list[dict]], int, float], list[str]]

TOPICS = {
    "coding": [
        "Python dictionaries",
        "reading a JSON file",
        "writing unit tests",
        "recursion",
        "regular expressions",
        "a binary search",
        "Python virtual environments",
        "sorting a list of dictionaries by a key",
        "exceptions in Python",
        "list comprehensions",
        "HTML forms",
        "CSS flexbox",
        "asynchronous code in JavaScript",
        "a REST API",
        "Docker containers",
        "SQL indexes",
        "merging branches in git",
        "a linked list",
        "big-O notation",
        "Python classes and inheritance",
        "string formatting in Python",
        "a command-line argument parser",
        "reading a large file line by line",
        "time zones in code",
        "hash tables",
        "memory leaks",
        "a simple web scraper",
        "environment variables",
        "pandas data frames",
        "off-by-one errors",
    ],
    "math": [
        "percentages of a price",
        "solving two linear equations",
        "simple interest on a loan",
        "the Pythagorean theorem",
        "converting fractions to decimals",
        "averages and medians",
        "the volume of a cylinder",
        "probability of rolling two dice",
        "unit conversion",
        "negative numbers",
        "exponents and roots",
        "a word problem about ages",
        "the perimeter of a rectangle",
        "ratios in a recipe",
        "long division",
        "quadratic equations",
        "the slope of a line",
        "compound growth",
        "basic statistics",
        "angles in a triangle",
        "logarithms",
        "a speed and distance puzzle",
        "rounding numbers",
        "the least common multiple",
        "integrals of polynomials",
    ],
    "writing": [
        "a birthday message for a coworker",
        "a short poem about rain",
        "a product review",
        "a cover letter opening",
        "a limerick about a cat",
        "a toast for a wedding",
        "an apology text to a friend",
        "a short story about a robot",
        "a slogan for a bakery",
        "a summary of a meeting",
        "a letter to a landlord about a repair",
        "a description of a sunset",
        "a speech for a school assembly",
        "a social media post about a charity run",
        "an out-of-office reply",
        "a bedtime story about a dragon",
        "song lyrics about summer",
        "a motivational quote",
        "a formal complaint about a late delivery",
        "a character description for a novel",
        "a review of a restaurant",
        "an invitation to a dinner party",
    ],
    "advice": [
        "managing stress at work",
        "learning to cook on a budget",
        "asking for a raise",
        "keeping houseplants alive",
        "running a first 5K",
        "studying for exams",
        "dealing with a difficult neighbour",
        "choosing a laptop",
        "planning a road trip",
        "reducing screen time",
        "negotiating rent",
        "starting a vegetable garden",
        "writing a resume",
        "getting up early",
        "moving to another country",
        "training a puppy",
        "organising a small apartment",
        "eating more vegetables",
        "handling criticism",
        "preparing for a marathon",
        "buying a used car",
        "learning to play guitar",
        "talking to a teenager",
        "staying motivated",
    ],
    "science": [
        "black holes",
        "how plants drink water",
        "the water cycle",
        "DNA",
        "earthquakes",
        "why ice floats",
        "the speed of light",
        "how batteries work",
        "climate and weather",
        "the human heart",
        "volcanoes",
        "magnets",
        "how airplanes fly",
        "evolution",
        "the phases of the Moon",
        "atoms and molecules",
        "rainbows",
        "antibiotics",
        "ocean tides",
        "how the brain stores memories",
        "solar panels",
        "sound waves",
        "the immune system's white blood cells",
        "why leaves change colour",
    ],
    "trivia": [
        "world capitals",
        "famous inventors",
        "the Olympic Games",
        "ancient Egypt",
        "the longest rivers",
        "famous composers",
        "the history of the printing press",
        "national flags",
        "the Roman Empire",
        "famous novels",
        "deserts of the world",
        "the first computers",
        "space exploration",
        "famous bridges",
        "world currencies",
        "dinosaurs",
        "the Renaissance",
        "chess history",
        "famous scientists",
        "the Seven Wonders of the ancient world",
        "mountain ranges",
        "musical instruments",
    ],
}

# How the target is asked to write a user's turn, by category.
_ASK_USER = {
    "coding": "Write one question a programmer might ask an AI assistant about {topic}.",
    "math": "Write one math question about {topic} that a student might ask, with numbers.",
    "writing": "Write one request a person might send to an AI assistant asking for {topic}.",
    "advice": "Write one question a person might ask an AI assistant about {topic}.",
    "science": "Write one question a curious person might ask about {topic}.",
    "trivia": "Write one trivia question about {topic}.",
}
_ONLY = " Reply with the question or request only, nothing else."
# Used when the target's own attempt is unusable (empty, a refusal, talk about the task).
_FALLBACK = {
    "coding": [
        "Can you explain {topic} with a short code example?",
        "I keep getting confused by {topic}. How does it work?",
        "What is the right way to use {topic} in a real project?",
    ],
    "math": [
        "Can you explain {topic} and work through one example?",
        "I have a test on {topic} tomorrow. Can you give me a practice problem and solve it?",
        "What is the trick to {topic}?",
    ],
    "writing": [
        "Please write {topic}.",
        "Can you help me write {topic}? Keep it short.",
        "I need {topic}. Make it sound natural.",
    ],
    "advice": [
        "Do you have some tips on {topic}?",
        "I am struggling with {topic}. Where should I start?",
        "What do most people get wrong about {topic}?",
    ],
    "science": [
        "Can you explain {topic} in simple terms?",
        "What do scientists know about {topic}?",
        "I read something about {topic} today. Is it really that complicated?",
    ],
    "trivia": [
        "Tell me an interesting fact about {topic}.",
        "Quiz me with one question about {topic}, then give the answer.",
        "What is something most people do not know about {topic}?",
    ],
}
# Lead-ins and talk about the task, which a user's real turn does not have.
_TASK_TALK = (
    "ai assistant",
    "helpful ai",
    "chatbot",
    "ask",
    "question",
    "reply",
    "help you",
    "what a ",
    "your style",
    "i'm ready",
    "you want",
)
_REQUESTS = (
    "write",
    "compose",
    "create",
    "draft",
    "give",
    "tell",
    "list",
    "explain",
    "please",
    "help",
    "make",
    "suggest",
    "describe",
    "summarize",
    "summarise",
    "translate",
)

SYSTEM_PROMPTS = [
    "Be a helpful assistant and keep every answer short.",
    "Explain things clearly and warmly, like a good friend would.",
    "You are an expert programmer. Answer with code where it helps.",
    "You are a careful tutor. Explain your reasoning step by step.",
    "You are a concise assistant. Answer in at most three sentences.",
    "You are a cheerful assistant for a travel company.",
    "You are a writing coach who gives practical feedback.",
    "You are a science teacher for middle-school students.",
    "Answer as briefly as possible.",
    "Use bullet points whenever you list things.",
]

FOLLOW_UPS = [
    "Can you give me an example?",
    "Can you explain that more simply?",
    "Why is that?",
    "Can you make it shorter?",
    "What are the most common mistakes?",
    "Thanks! What should I do next?",
    "Can you put that in a list?",
    "Is there another way to do it?",
    "What if I only have ten minutes?",
    "Could you expand on the second point?",
    "How would you explain this to a child?",
    "Can you summarise that in one sentence?",
]

# Document + question prompts: the kind of text the target writes, and questions about it.
DOCUMENTS = {
    "email": ["Summarise this email in one sentence.", "What is the sender asking for?"],
    "notice": ["What changes, and when?", "Who is this notice for?"],
    "recipe": ["How long does this take in total?", "Which ingredients do I need?"],
    "news report": ["What are the main facts?", "Give a one-line summary."],
    "product description": ["Who is this product for?", "List its main features."],
    "set of meeting notes": ["What was decided?", "Who has to do what next?"],
    "short story": ["What happens at the end?", "Describe the main character."],
    "set of instructions": ["What is the first step?", "Rewrite these steps as a checklist."],
}
_WRITE_DOCUMENT = "Write a short {kind} about {topic}. Write only the {kind}."

FORMS = ("question", "question", "question", "system", "multi-turn", "document")


def everyday_prompts(count: int, generate: Generate, seed: int = 0) -> list[list[dict]]:
    """`count` chat conversations (ending in a user turn) over the categories and forms above,
    their user turns and documents written by the target; three batched `generate` calls."""
    rng = random.Random(seed)
    plans = []  # (form, category, topic)
    categories = sorted(TOPICS)
    for i in range(count):
        category = categories[i % len(categories)]
        plans.append((rng.choice(FORMS), category, rng.choice(TOPICS[category])))

    asks = [
        [{"role": "user", "content": _ASK_USER[c].format(topic=t) + _ONLY}]
        for form, c, t in plans
        if form != "document"
    ]
    questions = iter(generate(asks, 48, 0.7))
    docs = [(rng.choice(sorted(DOCUMENTS)), t) for form, _, t in plans if form == "document"]
    written = iter(
        generate(
            [
                [{"role": "user", "content": _WRITE_DOCUMENT.format(kind=k, topic=t)}]
                for k, t in docs
            ],
            160,
            0.7,
        )
    )
    docs_iter = iter(docs)

    conversations = []
    for form, category, topic in plans:
        if form == "document":
            kind, _ = next(docs_iter)
            body = next(written).strip()
            question = rng.choice(DOCUMENTS[kind])
            text = f"Read this {kind} and answer the question.\n\n{body}\n\nQuestion: {question}"
            conversations.append([{"role": "user", "content": text}])
            continue
        user = clean_question(next(questions))
        if user is None:
            user = rng.choice(_FALLBACK[category]).format(topic=topic)
        turns = [{"role": "user", "content": user}]
        if form == "system":
            turns.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        conversations.append(turns)

    # two-turn conversations: the target's own first answer, then a follow-up
    multi = [i for i, (form, _, _) in enumerate(plans) if form == "multi-turn"]
    firsts = generate([conversations[i] for i in multi], 96, 0.0)
    for i, answer in zip(multi, firsts, strict=True):
        conversations[i] = conversations[i] + [
            {"role": "assistant", "content": answer.strip()},
            {"role": "user", "content": rng.choice(FOLLOW_UPS)},
        ]
    return conversations


def clean_question(text: str) -> str | None:
    """The user turn the target wrote, as a user would send it: its first non-empty line, the
    quoted part if it quotes one, else what follows a lead-in's colon; cut after the first
    question mark. None when that is not a question or request (too short or long, talk about
    the task, a refusal)."""
    line = next((x.strip() for x in text.strip().splitlines() if x.strip()), "")
    if _talks_about_the_task(line) and '"' not in line:
        return None
    quoted = re.findall(r'"([^"]{12,})"?', line)
    if quoted:
        line = quoted[0]
    elif ": " in line and len(line.rsplit(": ", 1)[1]) >= 12:
        line = line.rsplit(": ", 1)[1]
    line = line.strip().strip('"').strip()
    if "?" in line:
        line = line[: line.index("?") + 1]
    low = line.lower()
    if not 12 <= len(line) <= 300 or _talks_about_the_task(line):
        return None
    if low.startswith(("i'm sorry", "sorry", "as an ai", "i cannot", "i can't")):
        return None
    if not line.endswith("?") and not low.startswith(_REQUESTS):
        return None
    return line


def _talks_about_the_task(line: str) -> bool:
    low = line.lower()
    return any(re.search(rf"\b{re.escape(t.strip())}\b", low) for t in _TASK_TALK)
