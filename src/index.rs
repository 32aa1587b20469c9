//! The keyword index: which active records of a scope best match these tokens (BM25)?
//!
//! A tantivy index derived from the records: one document per active record with its `id`
//! (stored, raw), its `scope` (raw, filter only) and its `body` (the text's and keywords' tokens,
//! exactly the `text::tokenize` tokens, joined by spaces and split on whitespace, so BM25 sees
//! what the ranker sees). It never holds content the store has to trust: a hit is only an id,
//! and the store drops any id that is not active in fjall.
//!
//! The store's indexer thread stages changes into the one `IndexWriter` and commits them in
//! groups ([`KeywordIndex::commit`]), because a tantivy commit costs ~8 ms. Each commit carries a
//! payload: the highest outbox operation it covers (the watermark).
//!
//! **Invariant:** only this module knows tantivy.
//! **Invariant:** the index can always be rebuilt from the records ([`KeywordIndex::rebuild`]).

use std::path::Path;

use parking_lot::Mutex;
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::{BooleanQuery, ConstScoreQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING,
};
use tantivy::tokenizer::{TextAnalyzer, WhitespaceTokenizer};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use crate::error::{Error, Result};
use crate::text::for_each_token;

const TOKENIZER: &str = "lessons_tokens";
/// The writer's heap: tantivy's minimum per indexing thread is 15 MB; one thread is enough for
/// documents this small and leaves the second core to the store.
const WRITER_HEAP: usize = 20_000_000;

/// One document to (re)index or remove.
#[derive(Clone, Debug)]
pub enum IndexOp {
    /// An active record: delete any older copy, then add.
    Upsert {
        /// The record id.
        id: String,
        /// Its scope key.
        scope: String,
        /// Its text.
        text: String,
        /// Its keywords.
        keywords: Vec<String>,
    },
    /// A record that is no longer active (or does not exist).
    Delete {
        /// The record id.
        id: String,
    },
}

/// The tantivy index of active records.
pub struct KeywordIndex {
    reader: IndexReader,
    writer: Mutex<IndexWriter>,
    f_id: Field,
    f_scope: Field,
    f_body: Field,
}

/// What opening the index found.
pub struct Opened {
    /// The index, ready for staging and search.
    pub index: KeywordIndex,
    /// The last operation a commit covers; `None` when the index is new, was unreadable, or has
    /// no watermark, which all mean: rebuild it from the records.
    pub watermark: Option<u64>,
}

fn schema() -> (Schema, Field, Field, Field) {
    let mut b = Schema::builder();
    let f_id = b.add_text_field("id", STRING | STORED);
    let f_scope = b.add_text_field("scope", STRING);
    let body = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let f_body = b.add_text_field("body", body);
    (b.build(), f_id, f_scope, f_body)
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
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let (schema, f_id, f_scope, f_body) = schema();
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
            .and_then(|p| p.parse::<u64>().ok());
        let writer: IndexWriter = index
            .writer_with_num_threads(1, WRITER_HEAP)
            .map_err(|e| index_err("opening the index writer", e))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| index_err("opening the index reader", e))?;
        Ok(Opened {
            index: KeywordIndex {
                reader,
                writer: Mutex::new(writer),
                f_id,
                f_scope,
                f_body,
            },
            watermark,
        })
    }

    /// Stages `ops` in the writer; they become searchable at the next [`commit`](Self::commit).
    pub fn stage(&self, ops: &[IndexOp]) -> Result<()> {
        let writer = self.writer.lock();
        for op in ops {
            match op {
                IndexOp::Upsert {
                    id,
                    scope,
                    text,
                    keywords,
                } => {
                    writer.delete_term(Term::from_field_text(self.f_id, id));
                    let mut doc = TantivyDocument::default();
                    doc.add_text(self.f_id, id);
                    doc.add_text(self.f_scope, scope);
                    doc.add_text(self.f_body, body(text, keywords));
                    writer
                        .add_document(doc)
                        .map_err(|e| index_err("adding a document", e))?;
                }
                IndexOp::Delete { id } => {
                    writer.delete_term(Term::from_field_text(self.f_id, id));
                }
            }
        }
        Ok(())
    }

    /// Commits everything staged with `watermark` as the payload, and makes it searchable.
    pub fn commit(&self, watermark: u64) -> Result<()> {
        let mut writer = self.writer.lock();
        let mut prepared = writer
            .prepare_commit()
            .map_err(|e| index_err("preparing an index commit", e))?;
        prepared.set_payload(&watermark.to_string());
        prepared
            .commit()
            .map_err(|e| index_err("committing the index", e))?;
        drop(writer);
        self.reader
            .reload()
            .map_err(|e| index_err("reloading the index reader", e))
    }

    /// Replaces the whole index with `docs` (every active record) and commits with `watermark`.
    pub fn rebuild(
        &self,
        docs: impl Iterator<Item = Result<IndexOp>>,
        watermark: u64,
    ) -> Result<()> {
        {
            let writer = self.writer.lock();
            writer
                .delete_all_documents()
                .map_err(|e| index_err("clearing the index", e))?;
        }
        for op in docs {
            self.stage(&[op?])?;
        }
        self.commit(watermark)
    }

    /// The ids of the best `limit` documents of `scope` for `tokens`, best first.
    pub fn search(&self, scope: &str, tokens: &[String], limit: usize) -> Result<Vec<String>> {
        if tokens.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let scope_q: Box<dyn Query> = Box::new(ConstScoreQuery::new(
            Box::new(TermQuery::new(
                Term::from_field_text(self.f_scope, scope),
                IndexRecordOption::Basic,
            )),
            0.0,
        ));
        let terms: Vec<(Occur, Box<dyn Query>)> = tokens
            .iter()
            .map(|t| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(
                    Term::from_field_text(self.f_body, t),
                    IndexRecordOption::WithFreqs,
                ));
                (Occur::Should, q)
            })
            .collect();
        let query = BooleanQuery::new(vec![
            (Occur::Must, scope_q),
            (Occur::Must, Box::new(BooleanQuery::new(terms))),
        ]);
        let searcher = self.reader.searcher();
        let hits = searcher
            .search(&query, &TopDocs::with_limit(limit).order_by_score())
            .map_err(|e| index_err("searching the index", e))?;
        let mut ids = Vec::with_capacity(hits.len());
        for (_, addr) in hits {
            let doc: TantivyDocument = searcher
                .doc(addr)
                .map_err(|e| index_err("reading a hit", e))?;
            if let Some(id) = doc.get_first(self.f_id).and_then(|v| v.as_str()) {
                ids.push(id.to_owned());
            }
        }
        Ok(ids)
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

/// The indexed body: the record's tokens (text, then keywords) joined by spaces.
fn body(text: &str, keywords: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut push = |t: &str| {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(t);
    };
    for_each_token(text, &mut push);
    for k in keywords {
        for_each_token(k, &mut push);
    }
    out
}

impl IndexOp {
    /// The record id the operation is about.
    pub fn id(&self) -> &str {
        match self {
            IndexOp::Upsert { id, .. } | IndexOp::Delete { id } => id,
        }
    }
}
