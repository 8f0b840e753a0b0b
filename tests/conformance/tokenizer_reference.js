// tokenizer_reference.js: reference ids for test_tokenizer_conformance.py.
//
// Usage: node tokenizer_reference.js JOB.json > OUT.json
// JOB: {deps, tokenizer, texts:[str], decode:[[id]], chats:[{messages, add_generation_prompt,
//       date_string?}], chat_template_31?: str, lenml: bool}
// Encoding and decoding use HuggingFace's Rust `tokenizers` (npm). "Plain" mode
// (special-token text stays text) is the same tokenizer with its special added
// tokens removed, which is what the Rust encode_special_tokens switch does.
// Conversations are rendered by transformers.js (@lenml) apply_chat_template
// to text, then encoded by the Rust tokenizer with special tokens parsed.
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const nm = path.join(job.deps, 'npm', 'node_modules');
  const { Tokenizer } = require(path.join(nm, 'tokenizers'));
  const src = fs.readFileSync(job.tokenizer, 'utf8');
  const full = Tokenizer.fromString(src);
  const parsed = JSON.parse(src);
  parsed.added_tokens = (parsed.added_tokens || []).filter((t) => !t.special);
  const plain = Tokenizer.fromString(JSON.stringify(parsed));
  const out = { plain: [], special: [], special_bos: [], decode: [], decode_skip: [], chats: [], chat_text: [] };
  for (const t of job.texts) {
    out.plain.push((await plain.encode(t, null, { addSpecialTokens: false })).getIds());
    out.special.push((await full.encode(t, null, { addSpecialTokens: false })).getIds());
    out.special_bos.push((await full.encode(t, null, { addSpecialTokens: true })).getIds());
  }
  for (const ids of job.decode) {
    out.decode.push(Buffer.from(await full.decode(ids, false), 'utf8').toString('hex'));
    out.decode_skip.push(Buffer.from(await full.decode(ids, true), 'utf8').toString('hex'));
  }
  if (job.chats && job.chats.length) {
    const { fromPreTrained } = require(path.join(nm, '@lenml', 'tokenizer-llama3_1'));
    const lt = fromPreTrained();
    for (const c of job.chats) {
      const opts = { tokenize: false, add_generation_prompt: c.add_generation_prompt };
      if (c.date_string !== undefined) {
        opts.chat_template = job.chat_template_31;
        opts.date_string = c.date_string;
      }
      const text = lt.apply_chat_template(c.messages, opts);
      out.chat_text.push(text);
      out.chats.push((await full.encode(text, null, { addSpecialTokens: false })).getIds());
    }
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write('tokenizer_reference.js: ' + (e && e.stack ? e.stack : e) + '\n');
  process.exit(1);
});
