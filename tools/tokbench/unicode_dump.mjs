// unicode_dump.mjs UNICODE_PKG_DIR OUT - writes "cp category" for every assigned
// code point of the @unicode/unicode-X.Y.Z package (see gen_unicode.sh).
const base = process.argv[2] + '/General_Category/';
const cats = { Uppercase_Letter: 'Lu', Lowercase_Letter: 'Ll', Titlecase_Letter: 'Lt', Modifier_Letter: 'Lm', Other_Letter: 'Lo',
  Nonspacing_Mark: 'Mn', Spacing_Mark: 'Mc', Enclosing_Mark: 'Me', Decimal_Number: 'Nd', Letter_Number: 'Nl', Other_Number: 'No',
  Connector_Punctuation: 'Pc', Dash_Punctuation: 'Pd', Open_Punctuation: 'Ps', Close_Punctuation: 'Pe', Initial_Punctuation: 'Pi',
  Final_Punctuation: 'Pf', Other_Punctuation: 'Po', Math_Symbol: 'Sm', Currency_Symbol: 'Sc', Modifier_Symbol: 'Sk', Other_Symbol: 'So',
  Space_Separator: 'Zs', Line_Separator: 'Zl', Paragraph_Separator: 'Zp', Control: 'Cc', Format: 'Cf', Private_Use: 'Co' };
const out = [];
for (const [name, short] of Object.entries(cats)) {
  const cps = (await import(base + name + '/code-points.mjs')).default;
  for (const cp of cps) out.push(cp + ' ' + short);
}
(await import('fs')).writeFileSync(process.argv[3], out.join('\n') + '\n');

