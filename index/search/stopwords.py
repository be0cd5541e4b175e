"""Stop words per language, for the query side of the lexical leg (folded like the index).

The English, Spanish, German, French, Italian and Portuguese lists are the Snowball/NLTK lists as
shipped by ``bm25s`` (BSD-licensed); the Catalan list is a short one of its commonest function words.
A query's language is guessed as the list covering most of its terms, and only that list is
removed, so a word that is a stop word in one language ("die", "son") survives in another.
"""

from __future__ import annotations

__all__ = ["STOPWORDS", "strip_stopwords"]

_LISTS = {
    "en": """
        a an and are as at be but by for if in into is it no not of on or such that the their then there
        these they this to was will with""",
    "es": """
        a al algo algunas algunos ante antes como con contra cual cuando de del desde donde durante e el
        ella ellas ellos en entre era erais eramos eran eras eres es esa esas ese eso esos esta estaba
        estabais estabamos estaban estabas estad estada estadas estado estados estais estamos estan
        estando estar estara estaran estaras estare estareis estaremos estaria estariais estariamos
        estarian estarias estas este esteis estemos esten estes esto estos estoy estuve estuviera
        estuvierais estuvieramos estuvieran estuvieras estuvieron estuviese estuvieseis estuviesemos
        estuviesen estuvieses estuvimos estuviste estuvisteis estuvo fue fuera fuerais fueramos fueran
        fueras fueron fuese fueseis fuesemos fuesen fueses fui fuimos fuiste fuisteis ha habeis habia
        habiais habiamos habian habias habida habidas habido habidos habiendo habra habran habras habre
        habreis habremos habria habriais habriamos habrian habrias han has hasta hay haya hayais hayamos
        hayan hayas he hemos hube hubiera hubierais hubieramos hubieran hubieras hubieron hubiese
        hubieseis hubiesemos hubiesen hubieses hubimos hubiste hubisteis hubo la las le les lo los mas
        me mi mia mias mio mios mis mucho muchos muy nada ni no nos nosotras nosotros nuestra nuestras
        nuestro nuestros o os otra otras otro otros para pero poco por porque que quien quienes se sea
        seais seamos sean seas sentid sentida sentidas sentido sentidos sera seran seras sere sereis
        seremos seria seriais seriamos serian serias si siente sin sintiendo sobre sois somos son soy su
        sus suya suyas suyo suyos tambien tanto te tendra tendran tendras tendre tendreis tendremos
        tendria tendriais tendriamos tendrian tendrias tened teneis tenemos tenga tengais tengamos
        tengan tengas tengo tenia teniais teniamos tenian tenias tenida tenidas tenido tenidos teniendo
        ti tiene tienen tienes todo todos tu tus tuve tuviera tuvierais tuvieramos tuvieran tuvieras
        tuvieron tuviese tuvieseis tuviesemos tuviesen tuvieses tuvimos tuviste tuvisteis tuvo tuya
        tuyas tuyo tuyos un una uno unos vosotras vosotros vuestra vuestras vuestro vuestros y ya yo""",
    "de": """
        aber alle allem allen aller alles als also am an ander andere anderem anderen anderer anderes
        anderm andern anderr anders auch auf aus bei bin bis bist da damit dann das dass dasselbe dazu
        dein deine deinem deinen deiner deines dem demselben den denn denselben der derer derselbe
        derselben des desselben dessen dich die dies diese dieselbe dieselben diesem diesen dieser
        dieses dir doch dort du durch ein eine einem einen einer eines einig einige einigem einigen
        einiger einiges einmal er es etwas euch euer eure eurem euren eurer eures fur gegen gewesen hab
        habe haben hat hatte hatten hier hin hinter ich ihm ihn ihnen ihr ihre ihrem ihren ihrer ihres
        im in indem ins ist jede jedem jeden jeder jedes jene jenem jenen jener jenes jetzt kann kein
        keine keinem keinen keiner keines konnen konnte machen man manche manchem manchen mancher
        manches mein meine meinem meinen meiner meines mich mir mit muss musste nach nicht nichts noch
        nun nur ob oder ohne sehr sein seine seinem seinen seiner seines selbst sich sie sind so solche
        solchem solchen solcher solches soll sollte sondern sonst uber um und uns unser unsere unserem
        unseren unseres unter viel vom von vor wahrend war waren warst was weg weil weiter welche
        welchem welchen welcher welches wenn werde werden wie wieder will wir wird wirst wo wollen
        wollte wurde wurden zu zum zur zwar zwischen""",
    "fr": """
        a ai aie aient aies ait as au aura aurai auraient aurais aurait auras aurez auriez aurions
        aurons auront aux avaient avais avait avec avez aviez avions avons ayant ayante ayantes ayants
        ayez ayons c ce ces d dans de des du elle en es est et etaient etais etait etant etante etantes
        etants ete etee etees etes etiez etions eu eue eues eumes eurent eus eusse eussent eusses
        eussiez eussions eut eutes eux fumes furent fus fusse fussent fusses fussiez fussions fut futes
        il ils j je l la le les leur lui m ma mais me meme mes moi mon n ne nos notre nous on ont ou par
        pas pour qu que qui s sa se sera serai seraient serais serait seras serez seriez serions serons
        seront ses soient sois soit sommes son sont soyez soyons suis sur t ta te tes toi ton tu un une
        vos votre vous y""",
    "it": """
        a abbia abbiamo abbiano abbiate ad agl agli ai al all alla alle allo anche avemmo avendo avesse
        avessero avessi avessimo aveste avesti avete aveva avevamo avevano avevate avevi avevo avra
        avrai avranno avrebbe avrebbero avrei avremmo avremo avreste avresti avrete avro avuta avute
        avuti avuto c che chi ci coi col come con contro cui da dagl dagli dai dal dall dalla dalle
        dallo degl degli dei del dell della delle dello di dov dove e ebbe ebbero ebbi ed era erano
        eravamo eravate eri ero essendo faccia facciamo facciano facciate faccio facemmo facendo facesse
        facessero facessi facessimo faceste facesti faceva facevamo facevano facevate facevi facevo fai
        fanno fara farai faranno farebbe farebbero farei faremmo faremo fareste faresti farete faro fece
        fecero feci fosse fossero fossi fossimo foste fosti fu fui fummo furono gli ha hai hanno ho i il
        in io l la le lei li lo loro lui ma mi mia mie miei mio ne negl negli nei nel nell nella nelle
        nello noi non nostra nostre nostri nostro o per perche piu quale quanta quante quanti quanto
        quella quelle quelli quello questa queste questi questo sara sarai saranno sarebbe sarebbero
        sarei saremmo saremo sareste saresti sarete saro se sei si sia siamo siano siate siete sono sta
        stai stando stanno stara starai staranno starebbe starebbero starei staremmo staremo stareste
        staresti starete staro stava stavamo stavano stavate stavi stavo stemmo stesse stessero stessi
        stessimo steste stesti stette stettero stetti stia stiamo stiano stiate sto su sua sue sugl
        sugli sui sul sull sulla sulle sullo suo suoi ti tra tu tua tue tuo tuoi tutti tutto un una uno
        vi voi vostra vostre vostri vostro""",
    "pt": """
        a ao aos aquela aquelas aquele aqueles aquilo as ate com como da das de dela delas dele deles
        depois do dos e ela elas ele eles em entre era eram eramos essa essas esse esses esta estamos
        estao estar estas estava estavam estavamos este esteja estejam estejamos estes esteve estive
        estivemos estiver estivera estiveram estiveramos estiverem estivermos estivesse estivessem
        estivessemos estou eu foi fomos for fora foram foramos forem formos fosse fossem fossemos fui ha
        haja hajam hajamos hao havemos haver hei houve houvemos houver houvera houveram houveramos
        houverao houverei houverem houveremos houveria houveriam houveriamos houvermos houvesse
        houvessem houvessemos isso isto ja lhe lhes mais mas me mesmo meu meus minha minhas muito na nao
        nas nem no nos nossa nossas nosso nossos num numa o os ou para pela pelas pelo pelos por qual
        quando que quem sao se seja sejam sejamos sem ser sera serao serei seremos seria seriam seriamos
        seu seus so somos sou sua suas tambem te tem temos tenha tenham tenhamos tenho tera terao terei
        teremos teria teriam teriamos teu teus teve tinha tinham tinhamos tive tivemos tiver tivera
        tiveram tiveramos tiverem tivermos tivesse tivessem tivessemos tu tua tuas um uma voce voces vos""",
    "ca": """
        a al als amb aquell aquella aquelles aquells aquest aquesta aquestes aquests aqui cap com de del
        dels des dins el ell ella elles ells els em en entre era eren es esta estan estava et fa fins ha
        han havia hi i jo la les li lo ma mateix me mes meu meva molt na ni no nos nosaltres o on pel
        pels per pero perque qual quan que quin quina quines quins res s sa se sense ses seu seva si
        sobre son tambe te tenia tinc tot tots tu un una unes uns va vaig van vosaltres vostre""",
}

STOPWORDS: dict[str, frozenset[str]] = {lang: frozenset(words.split()) for lang, words in _LISTS.items()}


def strip_stopwords(terms: list[str]) -> list[str]:
    """``terms`` without the stop words of their most likely language; all of them if nothing else is left."""
    best = max(STOPWORDS.values(), key=lambda words: sum(t in words for t in terms))
    kept = [t for t in terms if t not in best]
    return kept or list(terms)
