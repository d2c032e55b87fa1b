// expected_splits.mjs - reference pre-tokenizer splits: runs each pre-tokenizer regex with
// JavaScript's RegExp (flags "gu", as transformers.js does, with (?i:...) rewritten to explicit
// case classes since JS has no inline modifiers) over the test text and writes the byte length
// of every match, space-separated, to OUTDIR/splits_NAME.txt.
// usage: node tools/tokenizer/expected_splits.mjs tests/tokenizer/data/mixed.txt OUTDIR [PREFIX]
// (files: OUTDIR/splits_PREFIXNAME.txt)
import { readFileSync, writeFileSync } from "node:fs";

const [, , textPath, outdir, prefix = ""] = process.argv;
const text = readFileSync(textPath, "utf8");
const ci = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const patterns = {
  gpt2: String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
  qwen2: ci + String.raw`|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
  llama3: ci + String.raw`|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
  o200k: String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` + ci + "?" +
    String.raw`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*` + ci + "?" +
    String.raw`|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};
for (const [name, src] of Object.entries(patterns)) {
  const re = new RegExp(src, "gu");
  const lens = [];
  let pos = 0;
  for (const m of text.matchAll(re)) {
    if (m.index !== pos) throw new Error(`${name}: unmatched text at ${pos}`);
    lens.push(Buffer.byteLength(m[0]));
    pos = m.index + m[0].length;
  }
  if (pos !== text.length) throw new Error(`${name}: unmatched tail`);
  writeFileSync(`${outdir}/splits_${prefix}${name}.txt`, lens.join(" ") + "\n");
  console.log(`${name}: ${lens.length} pieces`);
}
