"""Texts shared by the articles x questions tests (hooks and remote): three short articles, three questions,
and the per-model slack of evaluated tokens beyond a question's own."""

ARTICLES = [
    "The honeybee colony is a remarkable society. A single queen lays all of the eggs, while thousands of "
    "worker bees clean the hive, feed the young, build wax comb and gather nectar and pollen from flowers. "
    "Drones exist only to mate with queens from other colonies. In winter the bees cluster together and "
    "shiver their flight muscles to keep the centre of the cluster warm enough for the queen to survive.\n",
    "Glaciers form where more snow falls in winter than melts in summer. Over many years the snow is pressed "
    "into dense blue ice that slowly flows downhill under its own weight. As a glacier moves it scrapes the "
    "rock beneath it, carving deep valleys shaped like the letter U and carrying boulders far from where "
    "they started. Many glaciers around the world are now shrinking because summers have become warmer.\n",
    "The printing press built by Johannes Gutenberg around 1440 used movable metal type, oil based ink and a "
    "screw press adapted from those used to make wine. Books that had taken scribes months to copy by hand "
    "could now be produced in days, and their price fell quickly. Within fifty years presses were working "
    "in more than two hundred European cities, spreading news, science and new religious ideas.\n",
]
QUESTIONS = ["Question: What is the main topic of the text above? Answer:",
             "Question: Name one fact from the text. Answer:",
             "Question: Summarize the text in three words. Answer:"]
# Tokens evaluated beyond the question's own. SmolLM2: none (measured 0; 2 covers a tokenizer merge at the
# article/question boundary). Gemma 3 (SWA): llama-server resumes a sliding-window cache from its newest
# context checkpoint, which it takes 5 tokens before the end of each evaluated prompt, even when the new prompt
# extends the cached one exactly: measured on a plain server with no restore at all (prime 83 tokens with
# n_predict 0, then article + question: cache_n 78, prompt_n = question + 5), as in state-format.md 3
# (cache_n 295 of 300). The restored parent carries that checkpoint (SCKP appendix), so the cost stays 5.
SLACK = {"smollm2": 2, "gemma3": 7}
