//! The keyword index: which active records of a scope hold these terms, how often, and how long
//! is each?
//!
//! A tantivy index derived from the records: one document per active record with its `id`
//! (stored, raw, for deletes), its sequence number and its FTS length (fast fields), and its
//! `body`: the record's FTS tokens ([`crate::fts`], SQLite `unicode61` folding) that a query term
//! can equal, each prefixed with the scope key and a NUL, so a term's postings are one scope's
//! documents. The store scores the hits itself with FTS5's `bm25()` over per-scope totals
//! ([`crate::fts`]). The index never holds content the store has to trust: a hit is a sequence
//! number, and the store drops any that is not active in fjall.
//!
//! The store's indexer thread stages changes into the one `IndexWriter` and commits them in
//! groups ([`KeywordIndex::commit`]), because a tantivy commit costs ~8 ms. Each commit carries a
//! payload ([`Mark`]): the highest outbox operation it covers (the watermark) and the records'
//! journal position that was durable before it, so an index found ahead of the records at open
//! is evidence that acknowledged records were lost.
//!
//! **Invariant:** only this module knows tantivy.
//! **Invariant:** the index can always be rebuilt from the records ([`KeywordIndex::rebuild`]).

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use tantivy::directory::MmapDirectory;
use tantivy::postings::Postings;
use tantivy::query::{
    ConstScorer, EmptyScorer, EnableScoring, Explanation, Query, Scorer, TermQuery, Weight,
};
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions, Value,
    STORED, STRING,
};
use tantivy::tokenizer::{TextAnalyzer, WhitespaceTokenizer};
use tantivy::{
    DocId, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, SegmentReader, TantivyDocument,
    TantivyError, Term, TERMINATED,
};

use crate::error::{Error, Result};
use crate::fts::FtsDoc;
use crate::model::RecordId;

const TOKENIZER: &str = "lessons_tokens";
/// The writer's heap: tantivy's minimum per indexing thread is 15 MB; one thread is enough for
/// documents this small and leaves the second core to the store.
pub(crate) const WRITER_HEAP: usize = 20_000_000;

/// One document to (re)index or remove.
#[derive(Clone, Debug)]
pub enum IndexOp {
    /// An active record: delete any older copy, then add.
    Upsert {
        /// The record id.
        id: String,
        /// Its scope key.
        scope: String,
        /// Its FTS body, computed once for the index and for retrieve's view of the writes
        /// not yet committed to it.
        fts: std::sync::Arc<FtsDoc>,
    },
    /// A record that is no longer active (or does not exist).
    Delete {
        /// The record id.
        id: String,
    },
}

/// The tantivy index of active records.
pub struct KeywordIndex {
    /// The index's directory, synced after every commit: tantivy renames `meta.json` into
    /// place without syncing the directory (0.27, `save_metas` in
    /// `indexer/segment_updater.rs` syncs it *before* the rename), so a commit would not
    /// survive a power cut until some later sync. The outbox is trimmed after a commit, so an
    /// index that came back older than its commit would miss changes nothing replays.
    dir: PathBuf,
    reader: IndexReader,
    /// `None` once [`KeywordIndex::finish`] has waited for the writer's merges.
    writer: Mutex<Option<IndexWriter>>,
    f_id: Field,
    f_seq: Field,
    f_len: Field,
    f_body: Field,
}

/// One document holding a searched term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The record's sequence number.
    pub seq: u64,
    /// Its FTS length in tokens.
    pub len: u32,
    /// How often it holds each searched term, in the order asked.
    pub freqs: Vec<u32>,
}

/// The indexed term for `term` in `scope`: scope keys hold no whitespace or control
/// character, so the NUL separates them unambiguously and a term never spans two scopes.
fn scoped(scope: &str, term: &str) -> String {
    let mut out = String::with_capacity(scope.len() + 1 + term.len());
    out.push_str(scope);
    out.push('\0');
    out.push_str(term);
    out
}

/// What an index commit covers, kept as the commit's payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// The highest outbox operation whose changes the commit holds (the watermark).
    pub op: u64,
    /// The number of the last records batch, read before the records' journal was made
    /// durable ahead of this commit: every batch up to it was on disk when the index committed.
    /// `None` in an index written before this was kept.
    pub batch: Option<u64>,
}

impl Mark {
    fn payload(self) -> String {
        match self.batch {
            Some(b) => format!("{} {b}", self.op),
            None => self.op.to_string(),
        }
    }

    fn parse(payload: &str) -> Option<Mark> {
        let mut parts = payload.split(' ');
        let op = parts.next()?.parse().ok()?;
        let batch = match parts.next() {
            Some(b) => Some(b.parse().ok()?),
            None => None,
        };
        parts.next().is_none().then_some(Mark { op, batch })
    }
}

/// What opening the index found.
pub struct Opened {
    /// The index, ready for staging and search.
    pub index: KeywordIndex,
    /// What the last commit covers; `None` when the index is new, was unreadable, or has no
    /// watermark, which all mean: rebuild it from the records.
    pub watermark: Option<Mark>,
}

fn schema() -> (Schema, [Field; 4]) {
    let mut b = Schema::builder();
    let f_id = b.add_text_field("id", STRING | STORED);
    let f_seq = b.add_u64_field("seq", NumericOptions::default().set_fast());
    let f_len = b.add_u64_field("len", NumericOptions::default().set_fast());
    let body = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let f_body = b.add_text_field("body", body);
    (b.build(), [f_id, f_seq, f_len, f_body])
}

fn index_err(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::index(format!("{what}: {e}")).with_source(e)
}

impl KeywordIndex {
    /// Opens the index in `dir`, creating it if needed. An unreadable index or one with another
    /// schema is deleted and recreated empty (watermark `None`): it is derived data.
    pub fn open(dir: &Path) -> Result<Opened> {
        match Self::try_open(dir) {
            Ok(opened) => Ok(opened),
            Err(_) => {
                if dir.exists() {
                    std::fs::remove_dir_all(dir).map_err(|e| {
                        Error::io(format!("removing the damaged index {}", dir.display()), e)
                    })?;
                }
                let mut opened = Self::try_open(dir)?;
                opened.watermark = None;
                Ok(opened)
            }
        }
    }

    fn try_open(dir: &Path) -> Result<Opened> {
        crate::store::durable::create_dir(dir)?;
        remove_orphans(dir)?;
        let (schema, [f_id, f_seq, f_len, f_body]) = schema();
        let directory =
            MmapDirectory::open(dir).map_err(|e| index_err("opening the index directory", e))?;
        let index = Index::open_or_create(directory, schema)
            .map_err(|e| index_err("opening the index", e))?;
        index.tokenizers().register(
            TOKENIZER,
            TextAnalyzer::builder(WhitespaceTokenizer::default()).build(),
        );
        let watermark = index
            .load_metas()
            .map_err(|e| index_err("reading the index metadata", e))?
            .payload
            .and_then(|p| Mark::parse(&p));
        let writer: IndexWriter = index
            .writer_with_num_threads(1, WRITER_HEAP)
            .map_err(|e| index_err("opening the index writer", e))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| index_err("opening the index reader", e))?;
        crate::store::durable::sync_dir(dir)?;
        Ok(Opened {
            index: KeywordIndex {
                dir: dir.to_owned(),
                reader,
                writer: Mutex::new(Some(writer)),
                f_id,
                f_seq,
                f_len,
                f_body,
            },
            watermark,
        })
    }

    /// Stages `ops` in the writer; they become searchable at the next [`commit`](Self::commit).
    pub fn stage(&self, ops: &[IndexOp]) -> Result<()> {
        let guard = self.writer.lock();
        let writer = guard.as_ref().ok_or_else(finished)?;
        for op in ops {
            match op {
                IndexOp::Upsert { id, scope, fts } => {
                    self.delete(writer, id)?;
                    let Some(RecordId { seq, .. }) = RecordId::parse(id) else {
                        return Err(Error::index(format!("{id:?} is not a record id")));
                    };
                    let mut doc = TantivyDocument::default();
                    doc.add_text(self.f_id, id);
                    doc.add_u64(self.f_seq, seq);
                    doc.add_u64(self.f_len, u64::from(fts.len));
                    doc.add_text(self.f_body, body(scope, fts));
                    writer
                        .add_document(doc)
                        .map_err(|e| index_err("adding a document", e))?;
                }
                IndexOp::Delete { id } => self.delete(writer, id)?,
            }
        }
        Ok(())
    }

    /// Stages the removal of the document of record `id`, if the index holds one
    /// (`delete_query`: public in tantivy, though left out of its documentation).
    fn delete(&self, writer: &IndexWriter, id: &str) -> Result<()> {
        writer
            .delete_query(Box::new(IdQuery(Term::from_field_text(self.f_id, id))))
            .map_err(|e| index_err("removing a document", e))?;
        Ok(())
    }

    /// Commits everything staged with `mark` as the payload, and makes it searchable.
    pub fn commit(&self, mark: Mark) -> Result<()> {
        let mut guard = self.writer.lock();
        let writer = guard.as_mut().ok_or_else(finished)?;
        let mut prepared = writer
            .prepare_commit()
            .map_err(|e| index_err("preparing an index commit", e))?;
        prepared.set_payload(&mark.payload());
        prepared
            .commit()
            .map_err(|e| index_err("committing the index", e))?;
        drop(guard);
        crate::store::durable::sync_dir(&self.dir)?;
        self.reader
            .reload()
            .map_err(|e| index_err("reloading the index reader", e))
    }

    /// Replaces the whole index with `docs` (every active record) and commits with `mark`.
    /// The caller has nothing else staged. If a doc does not read, nothing of the rebuild stays
    /// staged: the clearing and the docs before it would otherwise go out with the next
    /// commit, and the index would answer for only part of the records until the next open.
    pub fn rebuild(
        &self,
        mut docs: impl Iterator<Item = Result<IndexOp>>,
        mark: Mark,
    ) -> Result<()> {
        {
            let guard = self.writer.lock();
            guard
                .as_ref()
                .ok_or_else(finished)?
                .delete_all_documents()
                .map_err(|e| index_err("clearing the index", e))?;
        }
        if let Err(e) = docs.try_for_each(|op| self.stage(&[op?])) {
            self.roll_back();
            return Err(e);
        }
        self.commit(mark)
    }

    /// Drops everything staged since the last commit. A writer that cannot roll back is
    /// released, so nothing staged can be committed after all (every later stage and commit
    /// then fails, as after `finish`, and the next open replays the outbox).
    fn roll_back(&self) {
        let mut guard = self.writer.lock();
        let Some(writer) = guard.as_mut() else {
            return;
        };
        if let Err(e) = writer.rollback() {
            log::warn!(
                "[index] rolling back a rebuild that failed: {e}; the index writer is released"
            );
            *guard = None;
        }
    }

    /// Lets the writer's background merges finish and releases it: dropping a writer kills
    /// its merges midway, which leaves their temporary files behind. Nothing can be staged
    /// afterwards.
    pub fn finish(&self) -> Result<()> {
        let writer = self.writer.lock().take();
        match writer {
            Some(w) => w
                .wait_merging_threads()
                .map_err(|e| index_err("finishing the index merges", e)),
            None => Ok(()),
        }
    }

    /// The id of every committed, live document.
    pub fn ids(&self) -> Result<Vec<String>> {
        let searcher = self.reader.searcher();
        let mut out = Vec::new();
        for (ord, segment) in searcher.segment_readers().iter().enumerate() {
            let alive = segment.alive_bitset();
            for doc in 0..segment.max_doc() {
                if alive.is_some_and(|a| !a.is_alive(doc)) {
                    continue;
                }
                let addr = tantivy::DocAddress::new(ord as u32, doc);
                let stored: TantivyDocument = searcher
                    .doc(addr)
                    .map_err(|e| index_err("reading a document's id", e))?;
                if let Some(id) = stored.get_first(self.f_id).and_then(|v| v.as_str()) {
                    out.push(id.to_owned());
                }
            }
        }
        Ok(out)
    }

    /// Every committed document of `scope` holding any of `terms`, with its term frequencies
    /// and length, in no particular order.
    pub fn matches(&self, scope: &str, terms: &[String]) -> Result<Vec<Hit>> {
        let searcher = self.reader.searcher();
        let mut out: Vec<Hit> = Vec::new();
        for segment in searcher.segment_readers() {
            let inverted = segment
                .inverted_index(self.f_body)
                .map_err(|e| index_err("reading the index", e))?;
            let alive = segment.alive_bitset();
            // Each hit's frequencies live in one flat vector, `terms.len()` per hit.
            let mut docs: crate::text::FnvMap<DocId, usize> = crate::text::FnvMap::default();
            let mut freqs: Vec<u32> = Vec::new();
            for (i, t) in terms.iter().enumerate() {
                let term = Term::from_field_text(self.f_body, &scoped(scope, t));
                let Some(mut postings) = inverted
                    .read_postings(&term, IndexRecordOption::WithFreqs)
                    .map_err(|e| index_err("reading postings", e))?
                else {
                    continue;
                };
                let mut doc = postings.doc();
                while doc != TERMINATED {
                    if alive.is_none_or(|a| a.is_alive(doc)) {
                        let at = *docs.entry(doc).or_insert_with(|| {
                            freqs.resize(freqs.len() + terms.len(), 0);
                            freqs.len() - terms.len()
                        });
                        if let Some(f) = freqs.get_mut(at + i) {
                            *f = postings.term_freq();
                        }
                    }
                    doc = postings.advance();
                }
            }
            if docs.is_empty() {
                continue;
            }
            let fast = segment.fast_fields();
            let seqs = fast
                .u64("seq")
                .map_err(|e| index_err("reading sequence numbers", e))?;
            let lens = fast
                .u64("len")
                .map_err(|e| index_err("reading lengths", e))?;
            for (doc, at) in docs {
                if let (Some(seq), Some(len)) = (seqs.first(doc), lens.first(doc)) {
                    out.push(Hit {
                        seq,
                        len: u32::try_from(len).unwrap_or(u32::MAX),
                        freqs: freqs.get(at..at + terms.len()).unwrap_or_default().to_vec(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Committed, searchable documents (deleted ones excluded).
    pub fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Whether the committed index holds a document with this id.
    pub fn contains(&self, id: &str) -> Result<bool> {
        let searcher = self.reader.searcher();
        let q = TermQuery::new(
            Term::from_field_text(self.f_id, id),
            IndexRecordOption::Basic,
        );
        let n = searcher
            .search(&q, &tantivy::collector::Count)
            .map_err(|e| index_err("searching the index", e))?;
        Ok(n > 0)
    }
}

fn finished() -> Error {
    Error::index("the index writer was already closed")
}

/// Removes what an interrupted tantivy write leaves in the directory: temporary files (`.tmp`
/// followed by random letters) that nothing references. The caller holds the store's lock, so
/// no other process writes here.
fn remove_orphans(dir: &Path) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with(".tmp")) {
            std::fs::remove_file(entry.path())
                .map_err(|e| Error::io(format!("removing {}", entry.path().display()), e))?;
        }
    }
    Ok(())
}

/// The documents holding one record id, as a delete finds them. `IndexWriter::delete_term`
/// keeps a `TermQuery`'s weight per delete until the commit applies it, and that weight carries
/// a BM25 table of 256 scores and an explanation even with scoring off: about 1.2 KB a delete,
/// and every upsert deletes first, so a commit's 16,384 changes would hold some 19 MB of them.
#[derive(Clone, Debug)]
struct IdQuery(Term);

impl Query for IdQuery {
    fn weight(&self, _: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(IdWeight(self.0.clone())))
    }
}

/// [`IdQuery`]'s weight: the id term and nothing else.
struct IdWeight(Term);

impl Weight for IdWeight {
    fn scorer(&self, reader: &SegmentReader, boost: f32) -> tantivy::Result<Box<dyn Scorer>> {
        let postings = reader
            .inverted_index(self.0.field())?
            .read_postings(&self.0, IndexRecordOption::Basic)?;
        Ok(match postings {
            Some(p) => Box::new(ConstScorer::new(p, boost)),
            None => Box::new(EmptyScorer),
        })
    }

    fn explain(&self, reader: &SegmentReader, doc: DocId) -> tantivy::Result<Explanation> {
        let mut scorer = self.scorer(reader, 1.0)?;
        // A seek never moves back: a scorer already past `doc` does not hold it.
        if scorer.doc() <= doc && scorer.seek(doc) == doc {
            Ok(Explanation::new("holds the record id", 1.0))
        } else {
            Err(TantivyError::InvalidArgument(format!(
                "document {doc} does not hold {:?}",
                self.0
            )))
        }
    }
}

/// The indexed body: the record's matchable FTS terms, scoped, joined by spaces.
fn body(scope: &str, fts: &FtsDoc) -> String {
    let mut out = String::new();
    for t in fts.terms() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(scope);
        out.push('\0');
        out.push_str(t);
    }
    out
}

impl IndexOp {
    /// The operation that makes the index hold active record `r`.
    pub fn upsert(r: &crate::model::Record) -> IndexOp {
        IndexOp::Upsert {
            id: r.id.clone(),
            scope: r.scope_key.as_str().to_owned(),
            fts: std::sync::Arc::new(crate::fts::FtsDoc::of(&r.text, &r.keywords)),
        }
    }

    /// The record id the operation is about.
    pub fn id(&self) -> &str {
        match self {
            IndexOp::Upsert { id, .. } | IndexOp::Delete { id } => id,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{IdQuery, IndexOp, KeywordIndex, Mark};
    use crate::fts::FtsDoc;
    use tantivy::query::{EnableScoring, Query};
    use tantivy::Term;

    fn upsert(id: &str, text: &str) -> IndexOp {
        IndexOp::Upsert {
            id: id.to_owned(),
            scope: "repo:acme/app".to_owned(),
            fts: Arc::new(FtsDoc::of(text, [""; 0])),
        }
    }

    fn seqs(index: &KeywordIndex, term: &str) -> Vec<u64> {
        let mut seqs: Vec<u64> = index
            .matches("repo:acme/app", &[term.to_owned()])
            .expect("matches")
            .into_iter()
            .map(|h| h.seq)
            .collect();
        seqs.sort_unstable();
        seqs
    }

    #[test]
    fn an_upsert_replaces_the_ids_document_and_a_delete_removes_it_in_any_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = KeywordIndex::open(dir.path()).expect("open").index;
        let id = |seq: u64| format!("mem:repo:acme/app:{seq}");
        // Three commits, so the documents live in several segments.
        let ops: Vec<IndexOp> = (1..=4).map(|n| upsert(&id(n), "cache warm")).collect();
        index.stage(&ops).expect("stage");
        index.commit(Mark::default()).expect("commit");
        // Replaced in a later commit, and twice within one.
        index
            .stage(&[
                upsert(&id(2), "lint first"),
                upsert(&id(3), "lint first"),
                upsert(&id(3), "types then"),
            ])
            .expect("stage");
        index.commit(Mark::default()).expect("commit");
        index
            .stage(&[IndexOp::Delete { id: id(1) }, upsert(&id(5), "cache cold")])
            .expect("stage");
        index.commit(Mark::default()).expect("commit");

        assert_eq!(index.num_docs(), 4);
        assert_eq!(seqs(&index, "cache"), vec![4, 5]);
        assert_eq!(seqs(&index, "lint"), vec![2]);
        assert_eq!(seqs(&index, "types"), vec![3]);
        assert!(!index.contains(&id(1)).expect("contains"));
        assert!(index.contains(&id(3)).expect("contains"));

        // The delete's weight finds one live document, and explains it and no other.
        let searcher = index.reader.searcher();
        let weight = IdQuery(Term::from_field_text(index.f_id, &id(3)))
            .weight(EnableScoring::disabled_from_searcher(&searcher))
            .expect("weight");
        let mut live = 0;
        let mut explained = Vec::new();
        for (ord, segment) in searcher.segment_readers().iter().enumerate() {
            live += weight.count(segment).expect("count");
            for doc in 0..segment.max_doc() {
                let alive = segment.alive_bitset().is_none_or(|a| a.is_alive(doc));
                if alive && weight.explain(segment, doc).is_ok() {
                    explained.push(tantivy::DocAddress::new(ord as u32, doc));
                }
            }
        }
        assert_eq!(live, 1, "one live document holds the id");
        assert_eq!(explained.len(), 1, "{explained:?}");
        let stored: tantivy::TantivyDocument = searcher.doc(explained[0]).expect("doc");
        use tantivy::schema::Value;
        assert_eq!(
            stored.get_first(index.f_id).and_then(|v| v.as_str()),
            Some(id(3).as_str())
        );
    }
}
