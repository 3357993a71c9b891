"""Fixed prompts: token ids for the tiny models' greedy checks (`PROMPTS`; their plain greedy
continuations are conftest's `references`), and text for end-to-end checks, two each of code, JSON
and prose (`E2E_PROMPTS`)."""

PROMPTS = [
    [5, 17, 42, 9, 9, 13],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17],
    [60],
    [33, 34, 35, 33, 34, 35, 33, 34],
]

E2E_PROMPTS = {
    "code-rewrite": (
        "Rewrite this function with type hints and a docstring, keeping the logic the same:\n\n"
        "def moving_average(values, window):\n"
        "    result = []\n"
        "    for i in range(len(values) - window + 1):\n"
        "        chunk = values[i:i + window]\n"
        "        result.append(sum(chunk) / window)\n"
        "    return result\n"
    ),
    "code-write": "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "json-extract": (
        "Extract the people as a JSON list of objects with keys name, age and city.\n\n"
        "Alice Moreau is 34 and lives in Lyon. Bob Jensen, 27, lives in Aarhus. "
        "Chiara Rossi is 45 and lives in Turin."
    ),
    "json-call": (
        'You can call get_weather(city: str, unit: "celsius" | "fahrenheit"). Answer with only a JSON object '
        'of the form {"name": ..., "arguments": {...}}. Question: how warm is it in Oslo in celsius?'
    ),
    "prose-summary": (
        "Summarise this paragraph in two sentences:\n\nThe city council met on Tuesday to discuss the new "
        "bicycle lanes. Supporters said the lanes would make commuting safer and reduce traffic, while "
        "shop owners worried that removing parking spaces would hurt their business. The council agreed "
        "to a six-month trial on two streets before making a final decision."
    ),
    "prose-story": "Tell a short story about a lighthouse keeper who finds a message in a bottle.",
}
