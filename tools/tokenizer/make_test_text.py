#!/usr/bin/env python3
"""make_test_text.py - writes tests/tokenizer/data/mixed.txt, the >= 10 kB tokenizer test text:
English, Chinese, Japanese, Russian, Arabic, German, code, whitespace runs (spaces, tabs, \\n,
\\r\\n), numbers, emoji (ZWJ sequences, skin tones, flags), special-token-like strings. NFC
(Qwen's tokenizer normalises to NFC), no U+0085/U+FEFF (JS \\s and Unicode White_Space differ
on those). Deterministic: no randomness."""
import sys
import unicodedata

P = []
P.append("""The quick brown fox jumps over the lazy dog. It's a well-known pangram; we'll use it, don't you think?
They've said I'm fine, you'd agree. HE'S LOUD, SHE'LL COME, WE'RE HERE, THEY'VE GONE, I'M OK, YOU'D SEE, IT'S 'quoted' text.
Mixed-case words: iPhone, McDonald's, eBay, NASA's, JavaScript, camelCaseIdentifier, snake_case_name, SCREAMING_SNAKE.
Abbreviations: e.g., i.e., etc., Dr. Smith vs. Mr. O'Neil — an em dash, an en dash – and … an ellipsis.
""")
P.append("""人工智能正在改变世界。大型语言模型可以理解和生成自然语言文本，例如回答问题、翻译文章、编写代码。
混合专家模型（Mixture of Experts，简称MoE）只激活一部分参数，因此推理速度更快。今天是2024年11月22日，气温为-3.5°C。
「引号」和《书名号》以及、顿号；分号：冒号！感叹号？问号。
""")
P.append("""日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。東京は日本の首都で、人口は約1400万人です。
トークナイザーのテストには、様々な文字種が必要です。ｶﾀｶﾅ（半角）と全角ＡＢＣ１２３も含めます。
""")
P.append("""Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России.
Программирование на языке C требует внимания к деталям. ЗАГЛАВНЫЕ БУКВЫ и строчные буквы. Ёлка, ёж, Ёжик.
""")
P.append("""النص العربي: مرحبا بالعالم! هذه جملة لاختبار المحلل اللغوي. الذكاء الاصطناعي يغير العالم بسرعة كبيرة.
الأرقام العربية: ٠١٢٣٤٥٦٧٨٩ والتشكيل: مَدْرَسَةٌ كِتَابٌ.
""")
P.append("""Deutscher Text: Größe, Übermäßig, Äpfel und Öl. Die Straße führt zum Flußufer. Fräulein Müller aß süße Brötchen.
GROSSBUCHSTABEN ÄÖÜ und kleinbuchstaben äöüß. Donaudampfschifffahrtsgesellschaftskapitän ist ein langes Wort.
Français: déjà vu, naïve, façade, où, Noël. Español: ¿Qué tal? ¡Muy bien! Niño, año, señor. Ελληνικά: Γειά σου κόσμε.
한국어 텍스트: 안녕하세요, 세계! हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก
""")
P.append('''```python
def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    a, b = 0, 1
    out = []
    for _ in range(n):
        out.append(a)
        a, b = b, a + b
    return out


if __name__ == "__main__":
\tprint(fibonacci(10))  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]
```
''')
P.append('''#include <stdio.h>
static int add(int a, int b) { return a + b; }
int main(int argc, char **argv) {
\tfor (int i = 0; i < argc; ++i) printf("%d: %s\\n", i, argv[i]);
\t\tif (argc > 1 && argv[1][0] == '-') return 1; /* comment */
\treturn add(2, 3) != 5;
}
// C++: std::vector<std::pair<int, float>> v{{1, 2.5f}}; auto x = v[0].first << 3 >>= 1;
const f = async (x) => { await fetch(`https://example.com/api?q=${x}&n=10`); return x ?? null; };
SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name HAVING COUNT(*) > 1;
<div class="a b" id='x'>&amp; &lt;tag&gt;</div> {"key": [1, 2.0, -3e-5, true, null], "s": "a\\"b"}
path/to/file.txt /usr/local/bin C:\\Windows\\System32 ../../up//double///triple
''')
P.append("Whitespace runs: one two  three   four    five     six      end\n")
P.append("tabs:\tone\t\ttwo\t\t\tthree \t mixed\t \tend\n")
P.append("trailing spaces   \nleading\n    indented four\n        indented eight\n\n\nthree newlines above\n")
P.append("windows line\r\nendings\r\n\r\nhere\r\n  \r\n\t\r\nend\n")
P.append("   \n \n\n  \t  \n")
P.append("non-breaking\u00a0space, thin\u2009space, ideographic\u3000space, em\u2003space, zero\u200bwidth.\n")
P.append("""Numbers: 0 1 12 123 1234 12345 123456 1234567 3.14159 2.718281828 -42 +7 1e10 6.02e23 0x1F 0b1010 1_000_000
1,234,567.89 $19.99 €5 ¥100 £3.50 100% 50/50 3/4 ½ ¾ ² ³ ⅓ 2024-11-22 12:34:56 +01:00 v1.2.3 IPv4 192.168.0.1
Phone: +1 (555) 123-4567. Roman: Ⅻ ⅻ. Full-width: ０１２３４５６７８９. 1st 2nd 3rd 4th 10x 3D 4K.
""")
P.append("""Emoji: 😀 😃 😄 😁 😆 😅 🤣 😂 🙂 🙃 😉 😊 😇 🥰 😍 🤩 😘 👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 👋🏽 🤝
ZWJ: 👨‍👩‍👧‍👦 👩‍💻 👨🏿‍🚀 🏳️‍🌈 🧑‍🤝‍🧑 👁️‍🗨️ ❤️‍🔥 🐻‍❄️. Flags: 🇩🇪 🇯🇵 🇺🇸 🇨🇳 🇷🇺 🇸🇦. Keycaps: 1️⃣ #️⃣ *️⃣.
Symbols: ★ ☆ ♠ ♣ ♥ ♦ ✓ ✗ → ← ↑ ↓ ⇒ ∀ ∃ ∈ ∑ ∏ √ ∞ ≈ ≠ ≤ ≥ ± × ÷ © ® ™ § ¶ † ‡ • · ° ′ ″ ‰ ‱ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚.
""")
P.append("""Special-token-like strings: <|endoftext|> <|im_start|>user
Hello<|im_end|> <|im_start|>assistant <|fake_token|> <s> </s> <unk> [INST] hi [/INST] <|start|>assistant<|channel|>final<|message|>ok<|end|>
<think>reasoning</think> <|return|> <|eot_id|> <<SYS>> <|begin_of_text|> <|reserved_special_token_0|> <pad> <mask> <|<|nested|>|>
""")
P.append("Contractions edge cases: 'S 's 'T 't 'RE 're 'VE 've 'M 'm 'LL 'll 'D 'd ''s '' ' x'y rock'n'roll ol' 'tis y'all\n")
P.append("Punctuation runs: !!! ??? ... --- ___ === +++ *** ### @@@ $$$ %%% ^^^ &&& ||| ~~~ ``` ((( ))) [[[ ]]] {{{ }}} <<< >>> /// \\\\\\ ;;; ::: ,,, \"\"\"\n")
P.append("Mixed scripts without spaces: abc中文def日本語ghiрусскийjklالعربية123αβγ\n")
P.append("Combining marks: e\u0301 a\u0308 n\u0303 (kept decomposed would be changed by NFC; these are composed: é ä ñ) Devanagari: क्षत्रिय\n")

text = "".join(P)
# more volume: numbered lines mixing everything, deterministic
langs = ["The year %d had %d days; it's %s.", "第%d章：%d个专家，激活率%s。", "第%d話の%d番目、%sです。",
         "Глава %d: %d экспертов, это %s.", "الفصل %d: %d خبير، %s.", "Kapitel %d: %d Experten, schön %s."]
words = ["good", "好", "良い", "хорошо", "جيد", "gut", "😀👍🏽", "\t", "  ", "\r\n", "don't", "Ünïcödé"]
i = 0
while len(text.encode("utf-8")) < 12000:
    line = langs[i % len(langs)] % (1900 + i * 7, (i * 37) % 1000, words[i % len(words)])
    text += line + (" " * (i % 4)) + ("\n" if i % 5 else "\n\n")
    i += 1
text = unicodedata.normalize("NFC", text)
assert "\u0085" not in text and "\ufeff" not in text
sys.stdout.buffer.write(text.encode("utf-8"))
