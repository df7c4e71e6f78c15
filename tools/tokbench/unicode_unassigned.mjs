// unicode_unassigned.mjs UNICODE_PKG_DIR OUT - writes the code points that
// the @unicode/unicode-X.Y.Z package lists as unassigned (Cn), one per line
// (see gen_unicode.sh).
const cps = (await import(process.argv[2] + '/General_Category/Unassigned/code-points.mjs')).default;
(await import('fs')).writeFileSync(process.argv[3], cps.join('\n') + '\n');
