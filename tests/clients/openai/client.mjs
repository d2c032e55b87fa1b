// client.mjs - the official openai package (pinned in package-lock.json) against hotmoe serve:
// chat, streaming, completions, a refused request, 16 concurrent streams. Prints one line per
// check ("ok ..." or "FAIL ..."); exit status 1 when one failed.
//   node client.mjs PORT
import OpenAI from "openai";

const client = new OpenAI({ baseURL: `http://127.0.0.1:${process.argv[2]}/v1`, apiKey: "sekret",
                            maxRetries: 0, timeout: 60000 });
let fails = 0;
const check = (name, ok) => { console.log((ok ? "ok   " : "FAIL ") + name); fails += ok ? 0 : 1; };

const models = await client.models.list();
check("models.list: the model", models.data.length === 1 && models.data[0].object === "model");

const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello" }];
const chat = await client.chat.completions.create({ model: models.data[0].id, messages: msgs,
                                                    max_tokens: 8, temperature: 0 });
check("chat: an assistant message", chat.choices[0].message.role === "assistant" &&
      typeof chat.choices[0].message.content === "string");
check("chat: usage", chat.usage.completion_tokens > 0 &&
      chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens);

const stream = await client.chat.completions.create({ model: "any", messages: msgs, max_tokens: 8,
                                                      temperature: 0, stream: true });
let text = "", finish = null;
for await (const chunk of stream) {
  if (chunk.choices.length) {
    text += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
}
check("chat stream: the same text as without streaming", text === chat.choices[0].message.content);
check("chat stream: a finish reason", finish === chat.choices[0].finish_reason);

const comp = await client.completions.create({ model: "any", prompt: "Once upon", max_tokens: 6,
                                               temperature: 0, stop: ["\n\n"] });
check("completions: text", typeof comp.choices[0].text === "string" && comp.usage.completion_tokens <= 6);

try {
  await client.chat.completions.create({ model: "any", messages: msgs, temperature: 9 });
  check("a bad request: refused", false);
} catch (e) {
  check("a bad request: BadRequestError (400) with the server's message",
        e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
}

const streams = await Promise.all(Array.from({ length: 16 }, async (_, i) => {
  const s = await client.chat.completions.create({ model: "any", max_tokens: 6, stream: true,
    messages: [{ role: "user", content: `Count to ${i}` }] });
  let n = 0;
  for await (const c of s) if (c.choices.length && c.choices[0].delta.content !== undefined) n++;
  return n;
}));
check("16 concurrent streams: each delivered chunks", streams.every(n => n >= 1));

process.exit(fails ? 1 : 0);
