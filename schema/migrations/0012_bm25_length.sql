-- BM25 document length (issue 13): the length BM25 normalizes term frequency by, stored per row.
--
-- The lexical leg used to take a chunk's length as every lexeme of its tsvector, which
-- counts what BM25's own tokenization never sees: stop words (the query side drops them, so
-- a chunk full of "the", "de", "und" looked long and was pushed down), one-character tokens
-- (PostgreSQL's parser keeps the "s" of "system's" and the "m" of "I'm"), and compound tokens
-- whose parts the parser also emits ("message-passing" is one lexeme plus "message" and
-- "passing": counted three times). On CACM that alone cost about 0.01 nDCG@10 against bm25s.
--
-- rag_bm25_length counts a chunk's tokens the way the query side scores them: two characters
-- or more, no parser compound (a lexeme with - . / @ :), and not a stop word of any language
-- the query side knows (the union of index/stopwords.py, which tests/test_text.py checks this
-- list against). The index still keeps every word; only the length changes. Adding the stored
-- column rewrites the table once, so existing rows get their length without re-embedding.

CREATE OR REPLACE FUNCTION rag_bm25_length(p_text text)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)::integer
    FROM unnest(to_tsvector('simple'::regconfig, p_text)) AS u
    WHERE length(u.lexeme) > 1
      AND u.lexeme !~ '[-./@:]'
      AND NOT (u.lexeme = ANY ('{
        a, abbia, abbiamo, abbiano, abbiate, aber, ad, agl, agli, ai, aie, aient, aies, ait, al, algo, algunas,
        algunos, all, alla, alle, allem, allen, aller, alles, allo, als, also, am, amb, an, anche, and, ander,
        andere, anderem, anderen, anderer, anderes, anderm, andern, anderr, anders, ante, antes, ao, aos,
        aquela, aquelas, aquele, aqueles, aquell, aquella, aquelles, aquells, aquest, aquesta, aquestes,
        aquests, aqui, aquilo, are, as, at, ate, au, auch, auf, aura, aurai, auraient, aurais, aurait, auras,
        aurez, auriez, aurions, aurons, auront, aus, aux, avaient, avais, avait, avec, avemmo, avendo, avesse,
        avessero, avessi, avessimo, aveste, avesti, avete, aveva, avevamo, avevano, avevate, avevi, avevo,
        avez, aviez, avions, avons, avra, avrai, avranno, avrebbe, avrebbero, avrei, avremmo, avremo,
        avreste, avresti, avrete, avro, avuta, avute, avuti, avuto, ayant, ayante, ayantes, ayants, ayez,
        ayons, be, bei, bin, bis, bist, but, by, c, cap, ce, ces, che, chi, ci, coi, col, com, come, como, con,
        contra, contro, cual, cuando, cui, d, da, dagl, dagli, dai, dal, dall, dalla, dalle, dallo, damit, dann,
        dans, das, dass, dasselbe, dazu, de, degl, degli, dei, dein, deine, deinem, deinen, deiner, deines, del,
        dela, delas, dele, deles, dell, della, delle, dello, dels, dem, demselben, den, denn, denselben,
        depois, der, derer, derselbe, derselben, des, desde, desselben, dessen, di, dich, die, dies, diese,
        dieselbe, dieselben, diesem, diesen, dieser, dieses, dins, dir, do, doch, donde, dort, dos, dov, dove,
        du, durante, durch, e, ebbe, ebbero, ebbi, ed, ein, eine, einem, einen, einer, eines, einig, einige,
        einigem, einigen, einiger, einiges, einmal, el, ela, elas, ele, eles, ell, ella, ellas, elle, elles,
        ellos, ells, els, em, en, entre, er, era, erais, eram, eramos, eran, erano, eras, eravamo, eravate, eren,
        eres, eri, ero, es, esa, esas, ese, eso, esos, essa, essas, esse, essendo, esses, est, esta, estaba,
        estabais, estabamos, estaban, estabas, estad, estada, estadas, estado, estados, estais, estamos,
        estan, estando, estao, estar, estara, estaran, estaras, estare, estareis, estaremos, estaria,
        estariais, estariamos, estarian, estarias, estas, estava, estavam, estavamos, este, esteis, esteja,
        estejam, estejamos, estemos, esten, estes, esteve, estive, estivemos, estiver, estivera, estiveram,
        estiveramos, estiverem, estivermos, estivesse, estivessem, estivessemos, esto, estos, estou,
        estoy, estuve, estuviera, estuvierais, estuvieramos, estuvieran, estuvieras, estuvieron,
        estuviese, estuvieseis, estuviesemos, estuviesen, estuvieses, estuvimos, estuviste, estuvisteis,
        estuvo, et, etaient, etais, etait, etant, etante, etantes, etants, ete, etee, etees, etes, etiez,
        etions, etwas, eu, euch, eue, euer, eues, eumes, eure, eurem, euren, eurent, eurer, eures, eus, eusse,
        eussent, eusses, eussiez, eussions, eut, eutes, eux, fa, faccia, facciamo, facciano, facciate,
        faccio, facemmo, facendo, facesse, facessero, facessi, facessimo, faceste, facesti, faceva,
        facevamo, facevano, facevate, facevi, facevo, fai, fanno, fara, farai, faranno, farebbe, farebbero,
        farei, faremmo, faremo, fareste, faresti, farete, faro, fece, fecero, feci, fins, foi, fomos, for,
        fora, foram, foramos, forem, formos, fosse, fossem, fossemos, fossero, fossi, fossimo, foste, fosti,
        fu, fue, fuera, fuerais, fueramos, fueran, fueras, fueron, fuese, fueseis, fuesemos, fuesen, fueses,
        fui, fuimos, fuiste, fuisteis, fumes, fummo, fur, furent, furono, fus, fusse, fussent, fusses,
        fussiez, fussions, fut, futes, gegen, gewesen, gli, ha, hab, habe, habeis, haben, habia, habiais,
        habiamos, habian, habias, habida, habidas, habido, habidos, habiendo, habra, habran, habras, habre,
        habreis, habremos, habria, habriais, habriamos, habrian, habrias, hai, haja, hajam, hajamos, han,
        hanno, hao, has, hasta, hat, hatte, hatten, havemos, haver, havia, hay, haya, hayais, hayamos, hayan,
        hayas, he, hei, hemos, hi, hier, hin, hinter, ho, houve, houvemos, houver, houvera, houveram,
        houveramos, houverao, houverei, houverem, houveremos, houveria, houveriam, houveriamos,
        houvermos, houvesse, houvessem, houvessemos, hube, hubiera, hubierais, hubieramos, hubieran,
        hubieras, hubieron, hubiese, hubieseis, hubiesemos, hubiesen, hubieses, hubimos, hubiste,
        hubisteis, hubo, i, ich, if, ihm, ihn, ihnen, ihr, ihre, ihrem, ihren, ihrer, ihres, il, ils, im, in,
        indem, ins, into, io, is, isso, ist, isto, it, j, ja, je, jede, jedem, jeden, jeder, jedes, jene, jenem,
        jenen, jener, jenes, jetzt, jo, kann, kein, keine, keinem, keinen, keiner, keines, konnen, konnte, l,
        la, las, le, lei, les, leur, lhe, lhes, li, lo, loro, los, lui, m, ma, machen, mais, man, manche, manchem,
        manchen, mancher, manches, mas, mateix, me, mein, meine, meinem, meinen, meiner, meines, meme, mes,
        mesmo, meu, meus, meva, mi, mia, mias, mich, mie, miei, minha, minhas, mio, mios, mir, mis, mit, moi, molt,
        mon, mucho, muchos, muito, muss, musste, muy, n, na, nach, nada, nao, nas, ne, negl, negli, nei, nel, nell,
        nella, nelle, nello, nem, ni, nicht, nichts, no, noch, noi, non, nos, nosaltres, nosotras, nosotros,
        nossa, nossas, nosso, nossos, nostra, nostre, nostri, nostro, not, notre, nous, nuestra, nuestras,
        nuestro, nuestros, num, numa, nun, nur, o, ob, oder, of, ohne, on, ont, or, os, otra, otras, otro, otros,
        ou, par, para, pas, pel, pela, pelas, pelo, pelos, pels, per, perche, pero, perque, piu, poco, por,
        porque, pour, qu, qual, quale, quan, quando, quanta, quante, quanti, quanto, que, quella, quelle,
        quelli, quello, quem, questa, queste, questi, questo, qui, quien, quienes, quin, quina, quines, quins,
        res, s, sa, sao, sara, sarai, saranno, sarebbe, sarebbero, sarei, saremmo, saremo, sareste, saresti,
        sarete, saro, se, sea, seais, seamos, sean, seas, sehr, sei, sein, seine, seinem, seinen, seiner,
        seines, seja, sejam, sejamos, selbst, sem, sense, sentid, sentida, sentidas, sentido, sentidos, ser,
        sera, serai, seraient, serais, serait, seran, serao, seras, sere, serei, sereis, seremos, serez,
        seria, seriais, seriam, seriamos, serian, serias, seriez, serions, serons, seront, ses, seu, seus,
        seva, si, sia, siamo, siano, siate, sich, sie, siente, siete, sin, sind, sintiendo, so, sobre, soient,
        sois, soit, solche, solchem, solchen, solcher, solches, soll, sollte, sommes, somos, son, sondern,
        sono, sonst, sont, sou, soy, soyez, soyons, sta, stai, stando, stanno, stara, starai, staranno,
        starebbe, starebbero, starei, staremmo, staremo, stareste, staresti, starete, staro, stava,
        stavamo, stavano, stavate, stavi, stavo, stemmo, stesse, stessero, stessi, stessimo, steste, stesti,
        stette, stettero, stetti, stia, stiamo, stiano, stiate, sto, su, sua, suas, such, sue, sugl, sugli, sui,
        suis, sul, sull, sulla, sulle, sullo, suo, suoi, sur, sus, suya, suyas, suyo, suyos, t, ta, tambe, tambem,
        tambien, tanto, te, tem, temos, tendra, tendran, tendras, tendre, tendreis, tendremos, tendria,
        tendriais, tendriamos, tendrian, tendrias, tened, teneis, tenemos, tenga, tengais, tengamos,
        tengan, tengas, tengo, tenha, tenham, tenhamos, tenho, tenia, teniais, teniamos, tenian, tenias,
        tenida, tenidas, tenido, tenidos, teniendo, tera, terao, terei, teremos, teria, teriam, teriamos,
        tes, teu, teus, teve, that, the, their, then, there, these, they, this, ti, tiene, tienen, tienes, tinc,
        tinha, tinham, tinhamos, tive, tivemos, tiver, tivera, tiveram, tiveramos, tiverem, tivermos,
        tivesse, tivessem, tivessemos, to, todo, todos, toi, ton, tot, tots, tra, tu, tua, tuas, tue, tuo, tuoi,
        tus, tutti, tutto, tuve, tuviera, tuvierais, tuvieramos, tuvieran, tuvieras, tuvieron, tuviese,
        tuvieseis, tuviesemos, tuviesen, tuvieses, tuvimos, tuviste, tuvisteis, tuvo, tuya, tuyas, tuyo,
        tuyos, uber, um, uma, un, una, und, une, unes, uno, unos, uns, unser, unsere, unserem, unseren, unseres,
        unter, va, vaig, van, vi, viel, voce, voces, voi, vom, von, vor, vos, vosaltres, vosotras, vosotros,
        vostra, vostre, vostri, vostro, votre, vous, vuestra, vuestras, vuestro, vuestros, wahrend, war,
        waren, warst, was, weg, weil, weiter, welche, welchem, welchen, welcher, welches, wenn, werde, werden,
        wie, wieder, will, wir, wird, wirst, with, wo, wollen, wollte, wurde, wurden, y, ya, yo, zu, zum, zur,
        zwar, zwischen
      }'::text[]))
$$;

ALTER TABLE rag_embeddings ADD COLUMN IF NOT EXISTS lexical_length integer
    GENERATED ALWAYS AS (rag_bm25_length(lexical_text)) STORED;
